"""``tierkv bench``: does tiering pay on this hardware? Real measurements, three ways.

- :mod:`.synthetic` — store and restore KV shaped like a real model through real vaults (the default);
- :mod:`.hf` — prefill vs hot hit vs cold restore TTFT with a random-weight transformers model;
- :mod:`.engine` — cold vs restored TTFT of any OpenAI-compatible server (vLLM, EXO), streamed.

:mod:`.breakeven` turns the measured prefill and restore rates into the prompt length above which a
restore beats recomputing; :mod:`.record` stamps every run with machine, versions and settings;
:mod:`.render` draws the tables. Submodules are imported on demand (torch only by :mod:`.hf`).
"""

from __future__ import annotations

from tierkv.errors import BenchError

__all__ = ["BenchError"]
