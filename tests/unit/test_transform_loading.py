import sys
from pathlib import Path

import pytest

from service.contract.loading import load_transform
from service.errors import ConfigError
from service.examples.square import square


def test_loads_module_function() -> None:
    assert load_transform("service.examples.square:square") is square


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("service.examples.square", "must have the form"),
        ("no.such.module:fn", "cannot import module 'no.such.module'"),
        ("service.examples.square:nope", "has no attribute 'nope'"),
        ("service.examples.fanout:os", "is a module, not callable"),
    ],
)
def test_unloadable_transform_is_a_config_error(ref: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_transform(ref)


def test_the_console_script_finds_a_transform_in_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `txstage run` from the folder holding mypkg/ failed with "No module named
    # 'mypkg'" while `python -m service run` imported it: a console script's sys.path
    # starts with its bin folder, not the current directory.
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "transforms.py").write_text("def fn(record):\n    return []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "mypkg", raising=False)
    monkeypatch.delitem(sys.modules, "mypkg.transforms", raising=False)
    assert callable(load_transform("mypkg.transforms:fn"))


@pytest.mark.parametrize(("ref", "hint"), [
    ("service.examples.square:sqare", "(did you mean service.examples.square:square?)"),
    ("service.examples.square:Square", "(did you mean service.examples.square:square?)"),
    # Nothing close: the module's own callables, not what it imported (Record, Output).
    ("service.examples.square:transform", "(its callables: square)"),
])
def test_a_misspelt_function_gets_a_did_you_mean(ref: str, hint: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_transform(ref)
    assert str(raised.value).endswith(f"has no attribute {ref.partition(':')[2]!r} {hint}")
