"""The files generated from the settings table: ``docs/options.md``, ``conf/defaults.yaml`` and the defaults in
``mxjob/core/constants.py`` (``make docs`` runs ``python -m mxjob.options.settings_docs .``; tests keep them equal)."""

from __future__ import annotations

import os
import textwrap

import yaml

from mxjob.options import settings  # read at each call: a test may add a setting to the table


def constants_text(current: str) -> str:
    """``mxjob/core/constants.py`` with its generated part (below the marker) made from the table.

    Every setting's library default as a class attribute of ``DEFAULT`` (a
    namespace with no imports), and the executor settings' names in table
    order, which :class:`mxjob.executor.partition.JobSpec` takes as its option fields.
    """
    head = current[:current.index(CONSTANTS_MARKER) + len(CONSTANTS_MARKER)]
    lines = ["", "", "class DEFAULT:",
             '    """Every setting\'s default as the library and the executors use it '
             '(``Setting.library_default``)."""', ""]
    lines += [f"    {s.name} = {s.library_default!r}" for s in settings.SETTINGS]
    executor = ", ".join(f'"{s.name}"' for s in settings.going_to("executor"))
    lines += ["", "", "#: The settings an executor reads (``to=\"executor\"``): ``JobSpec``'s option fields, "
              "in table order.",
              *textwrap.wrap(f"EXECUTOR_SETTINGS = ({executor})", 118, subsequent_indent="    ",
                             break_on_hyphens=False)]
    return head + "\n".join(lines) + "\n"


#: The line of ``mxjob/core/constants.py`` after which :func:`constants_text` writes.
CONSTANTS_MARKER = ("# ---- generated from mxjob/options/settings.py's SETTINGS by `make docs`; "
                    "do not edit below this line")


def defaults_yaml() -> str:
    """``conf/defaults.yaml``: every setting with its default and help, grouped by section."""

    lines = [
        "# Every job option with its default. Copy what you change into your own YAML",
        "# and pass it with --config (a path, or s3://... in cluster mode); options on",
        "# the command line override the file. Keys are the long option names with",
        '# "_" for "-", and go through the same types and ranges as the command line.',
        "# Generated from SETTINGS in mxjob/options/settings.py by `make docs`; do not edit by hand.",
    ]
    for section in settings.SECTIONS:
        lines += ["", f"# --- {section}"]
        for s in [s for s in settings.SETTINGS if s.section == section]:
            value = list(s.default) if isinstance(s.default, tuple) else s.default
            dumped = yaml.safe_dump({s.name: value}, default_flow_style=True, width=1000).strip()
            if dumped.startswith("{") and dumped.endswith("}"):
                dumped = dumped[1:-1]
            note = s.help if s.show_default is None else f"{s.help} Unset: {s.show_default}."
            first, *rest = textwrap.wrap(note, 110 - 30) or [""]
            lines.append(f"{dumped:<27} # {first}")
            lines += [f"{'':<27} # {more}" for more in rest]
    return "\n".join(lines) + "\n"


def options_markdown() -> str:
    """``docs/options.md``: every option's flags, default and help, one table per section."""
    out = [
        "# Options",
        "",
        "<!-- Generated from SETTINGS in mxjob/options/settings.py by `make docs`; "
        "tests/unit/options/test_settings.py keeps it equal. -->",
        "",
        "Every option can be given on the command line (`--batch-size 128`) or in a YAML file passed with "
        "`--config` (`batch_size: 128`: the long name with `_` for `-`); the command line wins over the file, "
        "the file over the default. [`conf/defaults.yaml`](../conf/defaults.yaml) lists every one with its default. "
        "Values from the file go through the same types and ranges as the command line. "
        "`--config URI` itself takes a path or an `s3://` URI.",
        "",
        "**Goes to** says where a setting acts: the driver, the executors, the model or the preprocessing recipe. "
        "**Resume** marks the settings that change what a line says about an image: `--resume` refuses to "
        "continue a run with a different value (see [Resume](resume.md)).",
    ]
    for section in settings.SECTIONS:
        out += ["", f"## {section[0].upper()}{section[1:]}", "",
                "| Option | Default | Goes to | Resume | What it does |", "|---|---|---|---|---|"]
        for s in [s for s in settings.SETTINGS if s.section == section]:
            flags = ", ".join(f"`{f}`" for f in s.flags)
            shown = s.default_text()
            if s.is_flag or isinstance(s.default, bool):
                shown = "off" if not s.default else "on"
            default_cell = f"`{shown}`" if shown else (s.show_default or ("empty" if shown == "" else "unset"))
            if s.default == ():
                default_cell = "none"
            resume = ("" if not s.fingerprint else f"{s.task} only" if s.task is not None
                      else "yes" if s.fingerprint is True else settings._FINGERPRINT_WHEN[s.fingerprint])
            goes = {"resolve": "driver"}.get(s.to, s.to)
            out.append(f"| {flags} | {_cell(default_cell)} | {goes} | {resume} | {_cell(s.help)} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


if __name__ == "__main__":  # python -m mxjob.options.settings_docs ROOT: write the generated files (make docs)
    import sys

    root = sys.argv[1] if len(sys.argv) > 1 else "."
    constants_path = os.path.join(root, "mxjob", "core", "constants.py")
    with open(constants_path, encoding="utf-8") as handle:
        constants_now = handle.read()
    for path, text in ((os.path.join(root, "conf", "defaults.yaml"), defaults_yaml()),
                       (os.path.join(root, "docs", "options.md"), options_markdown()),
                       (constants_path, constants_text(constants_now))):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"wrote {path}")
