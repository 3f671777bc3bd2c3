import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lake  # noqa: E402

why = lake.torch_gpu()


def pytest_collection_modifyitems(config, items):
    if why:
        for it in items:
            it.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(params=lake.MODES)
def mode(request):
    return request.param
