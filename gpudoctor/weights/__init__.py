"""Model weights: get a Hub model into a (tmpfs) directory fast, idempotently, verified.

Modules: :mod:`manifest` (the completeness record, pure), :mod:`plan` (what is missing),
:mod:`space` (will it fit), :mod:`copier` (parallel mirror restore), :mod:`hub`
(huggingface_hub calls), :mod:`verify` (size / sha256 checks), :mod:`ensure` (the
workflow) and :mod:`cli` (``gpudoctor weights ensure|status``).
"""
