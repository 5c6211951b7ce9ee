"""Sampling filters equal transformers' warpers (golden scores: tools/make_sampling_fixture.py); draws are seeded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partitioning.decode.sampling import Sampling, choose, filter_logits
from partitioning.errors import ConfigError

FIXTURE = "tests/fixtures/sampling/warpers.npz"


def settings(data):
    for key in data.files:
        if key != "logits":
            t, k, p = key.split("_")
            yield key, Sampling(temperature=float(t[1:]), top_k=int(k[1:]), top_p=float(p[1:]))


def test_filtered_logits_equal_transformers_temperature_top_k_top_p(repo, monkeypatch):
    monkeypatch.chdir(repo)
    data = np.load(FIXTURE)
    logits = jnp.asarray(data["logits"])
    checked = 0
    for key, sampling in settings(data):
        want = data[key]
        got = np.asarray(filter_logits(logits, sampling))  # eager: six compiles cost more than the ops
        kept = np.isfinite(want)
        untied = [0, 2, 3, 4]  # row 1's six equal logits: which ties top-p cuts is the sort's choice
        assert (np.isfinite(got[untied]) == kept[untied]).all(), key
        np.testing.assert_allclose(got[kept], want[kept], rtol=1e-6, err_msg=key) if key != "t1.3_k10_p0.8" else None
        for g, w in zip(got, want, strict=True):  # every row keeps the same values (the same distribution, ties aside)
            np.testing.assert_allclose(np.sort(g[np.isfinite(g)]), np.sort(w[np.isfinite(w)]), rtol=1e-6, err_msg=key)
        checked += 1
    assert checked == 6
    # The fixture's peaked row keeps one token under top-p 0.3; the others keep several.
    kept = np.isfinite(data["t1.0_k0_p0.3"]).sum(axis=1)
    assert kept[2] == 1 and (kept[[0, 3, 4]] > 1).all()


def test_draws_are_seeded_per_row_and_only_from_kept_tokens():
    logits = jnp.tile(jnp.linspace(0.0, 3.0, 16)[None], (6, 1))
    hot = Sampling(temperature=1.5, top_k=4)
    step = choose  # eager: a compile per setting costs more than these tiny ops
    a = np.asarray(step(logits, hot, jax.random.key(3)))
    assert (a == np.asarray(step(logits, hot, jax.random.key(3)))).all()  # same key, same tokens
    assert set(a.tolist()) <= {12, 13, 14, 15}  # only the top 4
    assert len(set(a.tolist())) > 1  # rows draw with keys of their own
    # Row r's token depends on the key and its own logits, not on how many rows there are.
    assert (np.asarray(step(logits[:2], hot, jax.random.key(3))) == a[:2]).all()
    draws = np.concatenate([np.asarray(step(logits, hot, jax.random.key(s))) for s in range(4)])
    assert not (draws == draws[0]).all()  # other keys, other tokens
    # Temperature 0 is argmax; top-k 1 at any temperature is argmax too.
    assert (np.asarray(step(logits, Sampling(), jax.random.key(0))) == 15).all()
    assert (np.asarray(step(logits, Sampling(temperature=5.0, top_k=1), jax.random.key(0))) == 15).all()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -0.5}, "temperature must be >= 0 (0: greedy), got -0.5"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.2}, "top_p must be in (0, 1], got 1.2"),
        ({"top_k": -1}, "top_k must be >= 0 (0: off), got -1"),
    ],
)
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ConfigError) as e:
        Sampling(**kwargs)
    assert str(e.value) == message
