"""Experiment trackers: rank 0 reports every step record to the trackers of ``[track]``.

- :mod:`.base`: what a tracker does, the scalars it gets, and :class:`Trackers`, which keeps a failing tracker
  from ever stopping training (one warning, then it is left out);
- :mod:`.extras`: which optional extra each tracker needs, checked before any process starts;
- :mod:`.tensorboard`, :mod:`.mlflow_tracker`, :mod:`.wandb_tracker`: the three trackers.

A resumed run continues the same tracked run: each tracker knows the last step it has (TensorBoard purges
events after the resumed step, MLflow and W&B find their run again and skip the steps they already hold, which
an exact resume would only repeat with the same values).
"""

from xtrain.train.tracking.base import Trackers, open_trackers, tracked_scalars
from xtrain.train.tracking.extras import check_tracker_extras

__all__ = ["Trackers", "check_tracker_extras", "open_trackers", "tracked_scalars"]
