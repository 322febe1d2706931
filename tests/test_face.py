"""The top-level face: the names a user starts from, importable from ``fhirgym``, each its layer's own
object, and ``import fhirgym`` loading no layer until one is used."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import fhirgym


@pytest.mark.parametrize("name", sorted(fhirgym._FACE))
def test_each_name_is_its_layers_own(name):
    assert getattr(fhirgym, name) is getattr(importlib.import_module(fhirgym._FACE[name]), name)


def test_importing_the_package_loads_no_layer_and_unknown_names_fail():
    code = "import sys, fhirgym; print(sorted(m for m in sys.modules if m.startswith('fhirgym')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['fhirgym']"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fhirgym.nothing  # noqa: B018
    assert set(fhirgym._FACE) <= set(dir(fhirgym))
