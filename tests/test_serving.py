"""docs/serving.md's example (export -> optimize_graph -> re-export -> AOTInductor package with
a dynamic batch), run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "serving.md"


@pytest.mark.slow
def test_the_serving_example_packages_an_optimized_model_that_matches_eager_at_two_batch_sizes():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    namespace: dict = {"__name__": "serving_example"}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)  # (its asserts check eager and the report)
    assert namespace["report"].batched and Path(namespace["package"]).exists()
