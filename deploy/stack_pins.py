"""The pins of one stack: requirements.txt with the stack file's pins in place of its own (``make venv STACK=emr8``).

    python deploy/stack_pins.py requirements.txt stacks/emr8.txt > .venv-emr8/requirements.txt

A stack file (``stacks/emr7.txt``, ``stacks/emr8.txt``) lists only the pins that
differ from requirements.txt, so each pin is declared once. pip cannot do this
itself: a constraint cannot loosen or change a requirement's pin, and two pins
of one name conflict. A stack pin of a name requirements.txt does not have is
an error (a typo would otherwise add a package). Lines are compared by their
name as pip normalizes it (PEP 503).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def name_of(line: str) -> str | None:
    """The normalized project name a requirement line pins, or None for a comment or a blank line."""
    text = line.split("#", 1)[0]
    match = _NAME.match(text)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def merged(requirements: str, stack: str) -> str:
    """``requirements`` with each line whose name ``stack`` pins replaced by the stack's line."""
    pins = {name_of(line): line.strip() for line in stack.splitlines() if name_of(line)}
    names = {name_of(line) for line in requirements.splitlines()}
    unknown = sorted(set(pins) - names)
    if unknown:
        raise ValueError(f"the stack pins {', '.join(unknown)}, which requirements.txt does not: a stack file only "
                         "changes requirements.txt's pins")
    return "".join(f"{pins.get(name_of(line), line)}\n" for line in requirements.splitlines())


def main(argv: list[str]) -> int:
    try:
        sys.stdout.write(merged(Path(argv[0]).read_text(), Path(argv[1]).read_text()))
    except (OSError, ValueError, IndexError) as exc:
        print(f"stack_pins: {exc}" if not isinstance(exc, IndexError) else __doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
