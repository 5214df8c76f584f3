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
