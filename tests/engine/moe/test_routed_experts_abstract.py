"""RoutedExperts is the abstract base of the expert kinds: it cannot be built without a ``compute``."""

from __future__ import annotations

import pytest
from xtrain.model.moe.experts import RoutedExperts


def test_routed_experts_without_compute_cannot_be_built() -> None:
    class NoCompute(RoutedExperts):
        pass

    with pytest.raises(TypeError, match="compute"):
        NoCompute()
