"""Finding what is wrong with a labelled data set from p_robust: suspect labels, atypical and
memorised points (:func:`find_issues`), scored in sample or out of sample (``folds``, which
:func:`train_folds` trains from a model factory). Needs the ``run`` extra (pandas).
"""

from probust.issues.find import COLUMNS, default_sigma, find_issues, label_quality
from probust.issues.folds import IN_SAMPLE, train_folds

__all__ = ["COLUMNS", "IN_SAMPLE", "default_sigma", "find_issues", "label_quality", "train_folds"]
