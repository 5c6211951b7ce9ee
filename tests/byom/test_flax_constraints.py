"""Activations constrained with Flax's own nn.with_logical_constraint (MaxText-style names) are seen by plan."""

import optax

import partitioning as pt
from tests.byom.models.constrained_linen import MaxTextStyleLM

RULES = [
    ["activation_batch", ["data", "fsdp"]],
    ["activation_mlp", "tensor"],
    ["embed", "fsdp"],
    ["mlp", "tensor"],
    ["vocab", "tensor"],
]
MESH = {"data": 1, "fsdp": 4, "tensor": 2}


def plan_for(rules):
    model = MaxTextStyleLM()
    params, opt = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=16)
    acts = pt.plan.activation_names(model, params, MESH, rules, batch_size=8, seq_len=16)
    return acts, pt.build_plan(params, opt, MESH, rules, activations=acts)


def test_plan_sees_flax_native_constraints_and_the_rules_that_claim_them():
    rules = pt.Rules(RULES, batch_axes=("data", "fsdp"))
    acts, plan = plan_for(rules)
    assert ("activation_batch", "activation_length", "activation_embed") in acts
    assert ("activation_batch", "activation_length", "activation_mlp") in acts
    assert plan.unused_rules == []  # activation_batch and activation_mlp claim activations
    assert plan.uncovered_names == ["activation_embed", "activation_length"]
    claimed = {d.name: d.rule_index for d in rules.explain(("activation_batch", "activation_length", "activation_mlp"))}
    assert claimed == {"activation_batch": 0, "activation_length": None, "activation_mlp": 1}


def test_a_rule_for_a_name_nothing_uses_is_reported_and_an_unsplit_batch_warns():
    acts, plan = plan_for(pt.Rules(RULES[2:] + [["activation_bacth", "data"]]))
    assert [u.rule for u in plan.unused_rules] == [["activation_bacth", "data"]]
    assert any(w.startswith("the batch is not split: no rule maps 'batch'") for w in plan.warnings())
    # With the batch declared, no such warning.
    _, ok = plan_for(pt.Rules(RULES, batch_axes=("data", "fsdp")))
    assert not any(w.startswith("the batch is not split") for w in ok.warnings())
