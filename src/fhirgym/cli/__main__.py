"""``python -m fhirgym.cli``: the ``fhirgym`` command."""

from . import main

main()
