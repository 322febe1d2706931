"""``composite`` rows ``(param, comp)``: comp is compact JSON, one list per component holding that
component's rows without the param code, each list deduplicated and sorted by ``repr``."""

from __future__ import annotations

import orjson


def component_json(parts: tuple[list, ...]) -> str:
    """Compact JSON of a composite row: per component, its rows minus the code, deduped and sorted."""
    values = []
    for rows in parts:
        if len(rows) == 1:
            values.append([rows[0][1:]])
        else:
            values.append(sorted(dict.fromkeys(r[1:] for r in rows), key=repr))
    return orjson.dumps(values).decode()
