"""Which non-OpenAI request fields each engine's OpenAI-compatible API accepts.

The load generator sends the OpenAI fields (``model``, ``prompt``/``messages``,
``max_tokens``, ``temperature``, ``stream``, ``stream_options``) and, from the plan's
workload, engine extensions such as ``ignore_eos``. An engine that validates against the
strict OpenAI schema answers every such request with HTTP 4xx: a whole campaign of
failed requests. The plan check (:func:`rejected_fields`, run by the plan parser, the
dry run too) refuses such a plan before any server starts.

Where each fact comes from (the engines' own request schemas):

- **sglang**: ``python/sglang/srt/entrypoints/openai/protocol.py`` (commit 004c82e0),
  ``CompletionRequest`` / ``ChatCompletionRequest``: "Extra parameters for SRT backend
  only" include ``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``,
  ``repetition_penalty``, ``stop_token_ids``, ``no_stop_trim``, ``skip_special_tokens``.
- **vllm**: ``vllm/entrypoints/openai/protocol.py`` (commit 0052bed3), the
  ``completion-sampling-params`` / ``chat-completion-sampling-params`` blocks pass
  ``ignore_eos`` and ``min_tokens`` into ``SamplingParams``; ``OpenAIBaseModel`` allows
  (and logs) unknown fields rather than rejecting them.
- **transformers** (``transformers serve``, 5.24.0): ``transformers/cli/serving/utils.py``
  ``BaseHandler._validate_request`` answers **HTTP 422 "Unexpected fields in the
  request"** for any key outside ``TransformersTextCompletionCreateParams``
  (``completion.py``: OpenAI's ``CompletionCreateParamsBase`` + ``generation_config``,
  ``seed``, ``stream``) or ``TransformersCompletionCreateParamsStreaming``
  (``chat_completion.py``: OpenAI's chat params + ``generation_config``, ``seed``,
  ``chat_template_kwargs``); ``stream_options`` is accepted and ignored (a warning).
  Seen on the H200 and the CPU box: ``ignore_eos`` -> 422 (issue 31).
- **command**: an arbitrary server: unknown; the warmup decides (a 4xx there fails
  the cell at once with the server's message).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.bench.cell_spec import WorkloadSpec

# Per engine, each of cell_spec.EXTENSION_FIELDS: True = accepted, False = rejected (HTTP 4xx);
# an engine missing here (``command``) is unknown.
ACCEPTS: dict[str, dict[str, bool]] = {
    "sglang": {"ignore_eos": True, "min_tokens": True},
    "vllm": {"ignore_eos": True, "min_tokens": True},
    "transformers": {"ignore_eos": False, "min_tokens": False},
}
SOURCES = {
    "sglang": "sglang python/sglang/srt/entrypoints/openai/protocol.py (CompletionRequest)",
    "vllm": "vllm vllm/entrypoints/openai/protocol.py (CompletionRequest)",
    "transformers": "transformers 5.24 cli/serving/utils.py _validate_request (HTTP 422)",
}


@dataclass(frozen=True)
class FieldProblem:
    """A request field the plan makes the client send that the engine rejects.

    Attributes:
        field: the request field (``ignore_eos``).
        key: the plan key that sends it (``workload.ignore_eos``).
        engine: the engine's name.
        fix: what to change in the plan.
    """

    field: str
    key: str
    engine: str
    fix: str

    def message(self) -> str:
        """Return one line: what the engine does with the field, and the change to make."""
        return (
            f"the {self.engine} engine rejects the request field {self.field!r} (HTTP 4xx on"
            f" every request; {SOURCES.get(self.engine, self.engine)}); {self.fix}"
        )


def sent_fields(workload: WorkloadSpec) -> dict[str, str]:
    """Return the engine-extension fields the client will send for ``workload``, each
    with the plan key that sends it (``{"ignore_eos": "workload.ignore_eos"}``)."""
    return {"ignore_eos": "workload.ignore_eos"} if workload.ignore_eos else {}


def rejected_fields(engine: str, workload: WorkloadSpec) -> list[FieldProblem]:
    """Return the fields ``workload`` makes the client send that ``engine`` rejects
    (empty for an engine that takes them all, or an unknown one such as ``command``)."""
    accepts = ACCEPTS.get(engine)
    if accepts is None:
        return []
    fixes = {"ignore_eos": "set ignore_eos = false in [workload] (output lengths then end at EOS)"}
    return [
        FieldProblem(name, key, engine, fixes.get(name, f"remove {key}"))
        for name, key in sent_fields(workload).items()
        if accepts.get(name) is False
    ]
