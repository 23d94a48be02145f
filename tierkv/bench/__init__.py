"""``tierkv bench``: does tiering pay on this hardware? Real measurements, three ways (subcommands).

- :mod:`.synthetic` — store and restore KV shaped like a real model through real vaults (the default);
- :mod:`.hf` — prefill vs hot hit vs cold restore TTFT with a random-weight transformers model, the
  restore split into network, codec and cache injection and set against the bare data plane;
- :mod:`.engine` — cold vs restored TTFT of any OpenAI-compatible server (vLLM, EXO), streamed.

:mod:`.cli` is the command (a subcommand per mode, the old flag spelling translated), :mod:`.runner`
turns its flags into settings, :mod:`.vaults` starts the vaults a run measures on (or uses the ones it
is told to). :mod:`.common` holds what the modes share (result record, time budget, progress bar,
setting checks); :mod:`.breakeven` turns the measured prefill and restore rates into the prompt length
above which a restore beats recomputing; :mod:`.quality` measures what a lossy codec costs in output;
:mod:`.record` stamps every run with machine, versions and settings; :mod:`.render` draws the tables.
Submodules are imported on demand (torch only by :mod:`.hf` when it runs, and :mod:`.quality`).
"""

from __future__ import annotations

from tierkv.errors import BenchError

__all__ = ["BenchError"]
