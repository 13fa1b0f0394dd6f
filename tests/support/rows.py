"""Groups to training rows for the update's tests, through the node's own pure step."""

from sapo.sampling.external_use import ExternalUse
from sapo.sampling.training_set import training_set
from sapo.training.learning.update import encode_rows

# Every row trains, a peer's failures too: the update's own behaviour, without the node's
# default choice of rows (that is tests/sampling's and test_off_policy_rows.py's subject).
EVERY_ROW = {"off_policy_rows": "all"}


def rows_of(policy, groups, **use):
    return training_set(groups, [], ExternalUse(**(EVERY_ROW | use)), policy.tokenizer_fingerprint).rows


def encode_groups(policy, groups, max_completion_tokens=64, **use):
    return encode_rows(policy, rows_of(policy, groups, **use), max_completion_tokens)
