"""``fhirgym memory show``: a memory directory, readably."""

from __future__ import annotations

from ._store import MemoryStore


def describe(store: MemoryStore, top: int = 5) -> str:
    c = store.counts()
    lines = [f"memory {store.path}", f"  embedder  {store.embedder.name}",
             f"  frozen    {store.frozen}  hash {store.content_hash or '-'}",
             f"  lessons   {c['lessons']}  (macro {c['macro']}, micro {c['micro']}, merged provenances {c['merged']})"]
    if c["micro_by_resource_type"]:
        lines.append("  micro tips by resource type:")
        lines += [f"    {t:28} {n}" for t, n in c["micro_by_resource_type"].items()]
    ranked = sorted(store.lessons, key=lambda x: (-len(x.provenance), x.kind, x.id))[:top]
    if ranked:
        lines.append(f"  top lessons (by supporting runs, first {len(ranked)}):")
    for x in ranked:
        key = "macro" if x.kind == "macro" else f"micro {x.resource_type} {x.operation}"
        fams = sorted({p["family"] for p in x.provenance})
        lines.append(f"    [{key}] ({len(x.provenance)} run(s): {', '.join(fams)})")
        lines.append(f"      {x.text}")
        if x.spec_paths:
            lines.append(f"      spec: {', '.join(x.spec_paths)}")
    return "\n".join(lines)
