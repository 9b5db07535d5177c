"""huggingface_hub in the pytest process, pointed at the loopback Hub (tests/weights/hub_server.py).

huggingface_hub reads its HF_* variables once, at import (recipe pitfall 1), so the
conftest fixture ``hf`` points the module constants it reads at call time (endpoint,
home, token file, offline) at a test's Hub and folders instead of setting the
environment; ``no_token`` clears every place a token is looked for.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpudoctor.weights.errors import WeightsError

TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME")
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def error_of(call: Callable[[], object]) -> WeightsError:
    """Return the WeightsError ``call()`` raises, checked to be one line with no chained cause."""
    with pytest.raises(WeightsError) as err:
        call()
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert "\n" not in str(err.value)
    return err.value
