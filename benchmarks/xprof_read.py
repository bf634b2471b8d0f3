"""Every task's ``--trace`` capture of a run read by XProf's own converters (a check run by hand,
with the profile extra: ``pip install 'ddlctl[profile]'``): the overview page, the trace viewer,
the input-pipeline analyser and the framework op stats, per task, with the size of what each gave.

    .venv/bin/python benchmarks/xprof_read.py runs/<id>
"""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = ("overview_page", "trace_viewer", "input_pipeline_analyzer", "framework_op_stats")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    from xprof.convert import raw_to_tool_data

    files = sorted(Path(sys.argv[1]).glob("profile/plugins/profile/*/*.xplane.pb"))
    if not files:
        print(f"no captures under {sys.argv[1]}/profile (launch with --trace A-B)", file=sys.stderr)
        return 1
    failed = 0
    for path in files:
        sizes = []
        for tool in TOOLS:
            try:
                data, _kind = raw_to_tool_data.xspace_to_tool_data([str(path)], tool, {})
                sizes.append(f"{tool} {len(data or b''):,} B")
                failed += not data
            except Exception as exc:  # noqa: BLE001 - say which tool failed on which file
                sizes.append(f"{tool} FAILED ({type(exc).__name__}: {exc})")
                failed += 1
        print(f"{path.parent.name}/{path.name}: " + ", ".join(sizes))
    print(f"{len(files)} capture(s), {failed} tool(s) without data")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
