"""The GPU check's table: one row per check (part, check, value, and ok / MISMATCH / info), printed as
each row is added and once more as one table at the end."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    part: str
    check: str
    value: str
    ok: bool | None  # None: information, not a pass/fail check


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, part: str, check: str, value, ok: bool | None = True) -> None:
        self.rows.append(Row(part, check, str(value), ok))
        mark = {True: "ok", False: "MISMATCH", None: "info"}[ok]
        print(f"  [{part}] {check}: {value} ({mark})", flush=True)

    def table(self) -> str:
        w = [max(len(getattr(r, a)) for r in self.rows + [Row("part", "check", "value", None)])
             for a in ("part", "check", "value")]
        lines = [f"{'part':<{w[0]}}  {'check':<{w[1]}}  {'value':<{w[2]}}  status"]
        lines.append("-" * len(lines[0]))
        for r in self.rows:
            status = {True: "ok", False: "MISMATCH", None: "info"}[r.ok]
            lines.append(f"{r.part:<{w[0]}}  {r.check:<{w[1]}}  {r.value:<{w[2]}}  {status}")
        return "\n".join(lines)
