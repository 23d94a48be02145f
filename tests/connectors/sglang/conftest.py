"""SGLang's cache classes need a few things set up before the first import of SGLang (see cpu_torch)."""

import importlib.util

if importlib.util.find_spec("sglang") is not None:
    from tests.connectors.sglang.cpu_torch import prepare_sglang

    prepare_sglang()
