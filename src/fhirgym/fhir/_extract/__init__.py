"""Write-time search index extraction: every official R4 search parameter, turned into index rows.

``extractor`` plans one generated function per resource type: ``parse`` and ``walks`` turn the ~99 %
of R4 expressions that are plain paths into typed walks, ``codegen`` into Python; ``fallback`` runs
fixed fhirpathpy on the rest; ``rows/`` has one row builder module per index kind. Row shapes and
the indexing choices: docs/SEARCH_INDEX.md.
"""

from .extractor import COMPONENT_FIXES, TABLES, UNSUPPORTED_REASONS, Extractor

__all__ = ["COMPONENT_FIXES", "TABLES", "UNSUPPORTED_REASONS", "Extractor"]
