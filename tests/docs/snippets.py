"""Run the "getting started" pages: every fenced ``bash`` and ``python`` block, in order, as one shell script.

A page is executed as a user would paste it, in an empty directory that is also ``$HOME``, against real
vault processes (and engines) on loopback. HTML comments, invisible on the site, steer the run:

- ``<!-- test: after PAGE -->``: run that page of the same folder first (its vault, its config);
- ``<!-- test: wait-port PORT -->`` / ``wait-vault PORT`` / ``wait-http URL [SECONDS]``: wait until a
  background process the page started accepts connections (answers a Stats call, answers 200);
- ``<!-- test: expect REGEX -->``: the next block's output must match (``grep -E``);
- ``<!-- test: skip install -->``: the next block installs packages; it is not run (the test environment
  is the installed result), and it may hold nothing but ``python3 -m venv`` and ``pip`` commands;
- ``<!-- test: skip exo -->``: the next block drives a real EXO installation, which the test machines do
  not have; it may hold nothing but ``tierkv exo`` commands (tested against a stand-in EXO in
  ``tests/connectors/exo``).

The documented ports (50051, 50052, 8000, 8080) are replaced by free ones so that runs never meet other
processes on the machine.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from tests.ports import free_ports

FENCE = re.compile(r"^```(\w+)?[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
DIRECTIVE = re.compile(r"<!--\s*test:\s*(.*?)\s*-->")
PORTS = (50051, 50052, 8000, 8080)
SKIPPABLE = {
    "install": re.compile(r"^(python3? -m venv \S+|(\S*/)?pip (install|uninstall) .+)$"),
    "exo": re.compile(r"^tierkv exo (install|status|uninstall)\b.*$"),
}

PRELUDE = r"""
set -euo pipefail
cleanup() { for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done; wait || true; }
trap cleanup EXIT
wait_for() {
  python - "$1" "$2" "${3:-120}" <<'PYEOF'
import socket, sys, time, urllib.request
kind, target, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])


def ready() -> bool:
    if kind == "port":
        socket.create_connection(("127.0.0.1", int(target)), timeout=1).close()
        return True
    if kind == "vault":
        from tierkv import VaultClient
        with VaultClient(f"127.0.0.1:{target}", timeout=5.0) as client:
            client.stats()
        return True
    with urllib.request.urlopen(target, timeout=2) as reply:
        return bool(reply.status == 200)


from tierkv.errors import TierKVError
missing = {"port": f"nothing listens on port {target}", "vault": f"no vault answers on port {target}"}
deadline = time.monotonic() + limit
while True:
    try:
        if ready():
            break
    except (OSError, TierKVError):
        pass
    if time.monotonic() > deadline:
        sys.exit(f"{missing.get(kind, f'{target} did not answer 200')} after {limit:.0f} s")
    time.sleep(1 if kind == "http" else 0.2)
PYEOF
}
expect() {
  cat "$2"
  grep -Eq -- "$1" "$2" || { echo "expected output matching: $1" >&2; exit 1; }
}
"""


@dataclasses.dataclass(frozen=True)
class Step:
    """One block of a page and the directives that precede it."""

    language: str
    code: str
    directives: tuple[str, ...]


def steps(text: str) -> list[Step]:
    """The page's fenced blocks, each with the directives written since the previous block."""
    out: list[Step] = []
    at = 0
    for match in FENCE.finditer(text):
        directives = tuple(DIRECTIVE.findall(text[at : match.start()]))
        out.append(Step(match.group(1) or "", match.group(2), directives))
        at = match.end()
    tail = tuple(DIRECTIVE.findall(text[at:]))
    if tail:
        out.append(Step("", "", tail))
    return out


def check_skippable(code: str, kind: str = "install") -> None:
    """A block marked ``skip KIND`` may hold only the commands that kind allows."""
    allowed = SKIPPABLE[kind]
    for line in code.splitlines():
        for command in (c.strip() for c in line.split("  #")[0].split("&&")):
            if command and not allowed.match(command):
                raise ValueError(f"a block marked 'skip {kind}' runs more than that: {command!r}")


def script(page: Path) -> str:
    """The page (after the pages it names) as one bash script, without port substitution."""
    parts: list[str] = []
    for n, step in enumerate(steps(page.read_text())):
        expect = None
        for directive in step.directives:
            verb, _, arg = directive.partition(" ")
            if verb == "after":
                parts.append(script(page.parent / arg))
            elif verb in ("wait-port", "wait-vault", "wait-http"):
                parts.append(f"wait_for {verb.removeprefix('wait-')} {arg}")
            elif verb == "expect":
                quoted = len(arg) > 1 and arg[0] == arg[-1] == '"'
                expect = arg[1:-1].replace('\\"', '"') if quoted else arg
            elif verb == "skip" and arg in SKIPPABLE:
                check_skippable(step.code, arg)
            else:
                raise ValueError(f"{page.name}: unknown test directive {directive!r}")
        if not step.code or any(d.startswith("skip ") for d in step.directives):
            continue
        body = _shell(step, page)
        if expect is None:
            parts.append(body)
        else:
            out = f".out-{page.stem}-{n}"
            parts.append(f"{{\n{body}\n}} > {out} 2>&1 || {{ cat {out}; exit 1; }}")
            parts.append(f"expect {shlex.quote(expect)} {out}")
    return "\n".join(parts)


def _shell(step: Step, page: Path) -> str:
    if step.language == "bash":
        return step.code.rstrip("\n")
    if step.language == "python":
        return f"python - <<'PYEOF'\n{step.code}PYEOF"
    raise ValueError(f"{page.name}: a block in {step.language or 'no language'} cannot be run")


def runnable(page: Path) -> str:
    """The script with the prelude and the documented ports replaced by free ones."""
    text = script(page)
    for documented, free in zip(PORTS, free_ports(len(PORTS)), strict=True):
        text = re.sub(rf"(?<![\d.]){documented}(?!\d)", str(free), text)
    return PRELUDE + text + "\n"
