"""YAML configs (partitioning.config.load): every error names file, line and key."""

import pytest

import partitioning as pt
from partitioning.config import load_config, load_rules_file
from partitioning.config.build import model_from_config
from partitioning.fmt import fmt_mesh


def test_quickstart_loads(repo):
    cfg = load_config(repo / "configs" / "quickstart.yaml")
    assert cfg.model_name == "gpt"
    assert cfg.rules == pt.Rules.preset("fsdp")
    assert cfg.mesh.shape == {"data": 1, "fsdp": -1, "tensor": 1}


def test_rules_forms(write, base_config):
    inline = write(
        "a.yaml",
        base_config.replace("rules: fsdp", "rules:\n  - [batch, [data, fsdp]]\n  - [embed, fsdp]\n  - [mlp, null]\n"),
    )
    cfg = load_config(inline)
    assert list(cfg.rules) == [("batch", ("data", "fsdp")), ("embed", "fsdp"), ("mlp", None)]
    assert cfg.rules.origins[2] == f"{inline}:13: rules[2]"
    extra = write(
        "b.yaml", base_config.replace("rules: fsdp", "rules:\n  preset: fsdp\n  extra:\n    - [mlp, tensor]\n")
    )
    cfg = load_config(extra)
    assert cfg.rules[0] == ("mlp", "tensor") and cfg.rules[1:] == pt.Rules.preset("fsdp")
    rules_file = write("r.yaml", "rules:\n  - [embed, fsdp]\n")
    cfg = load_config(write("c.yaml", base_config.replace("rules: fsdp", "rules: r.yaml")))
    assert list(cfg.rules) == [("embed", "fsdp")]
    assert list(load_rules_file(rules_file)) == [("embed", "fsdp")]


def test_overrides(write, base_config):
    cfg = load_config(
        write("a.yaml", base_config),
        ["train.steps=7", "rules=tp", "mesh.shape={data: 2, tensor: -1}", "model.layers=3", "optimizer.lr=0.01"],
    )
    assert cfg.train.steps == 7 and cfg.rules == pt.Rules.preset("tp")
    assert cfg.mesh.shape == {"data": 2, "tensor": -1}
    assert cfg.model_options["layers"] == 3 and cfg.optimizer.lr == 0.01
    assert cfg.raw["train"]["steps"] == 7  # the resolved config is what gets saved


# Each case turns the base config's text into a broken config.
@pytest.mark.parametrize(
    "edit, overrides, expected",
    [
        # typo in a rule's mesh axis: file, line, key, axes, suggestion
        (
            lambda base: base.replace(
                "rules: fsdp", "rules:\n  - [batch, data]\n  - [embed, fsdp]\n  - [heads, null]\n  - [mlp, tensr]\n"
            ),
            [],
            "{f}:14: rules[3]: mesh axis 'tensr' is not a mesh axis (data, fsdp, tensor); did you mean 'tensor'?",
        ),
        (
            lambda base: base + "trian:\n  steps: 3\n",
            [],
            "{f}:11: trian: unknown key (valid: model, mesh, rules, optimizer_rules, annotations, on_indivisible, "
            "data, optimizer, train, checkpoint, run_dir, base); did you mean 'train'?",
        ),
        (
            lambda base: base + "train:\n  stpes: 3\n",
            [],
            "{f}:12: train.stpes: unknown key (valid: steps, batch_size, seq_len, grad_accum, microbatches, "
            "pipeline_repeats, log_every, eval_every, eval_batches, tracker, seed, loss, step, inputs, rngs, "
            "on_nonfinite, trainable, measure_defaults, max_skipped_steps, offload, offload_update); "
            "did you mean 'steps'?",
        ),
        (lambda base: base + "train:\n  steps: many\n", [], "{f}:12: train.steps: expected int, got str 'many'"),
        (
            lambda base: base + "optimizer:\n  name: adamm\n",
            [],
            "{f}:12: optimizer.name: must be one of adamw, adafactor, sgd, got 'adamm'; did you mean 'adamw'?",
        ),
        (
            lambda base: base.replace("shape: {data: 1, fsdp: -1, tensor: 1}", "shape: {data: -1, fsdp: -1}"),
            [],
            "{f}:8: mesh.shape: mesh {'data': -1, 'fsdp': -1} has more than one -1; at most one axis can take the "
            "rest of the devices",
        ),
        (
            lambda base: base.replace("  embed: 64\n", "  embedd: 64\n"),
            [],
            "{f}:3: model.embedd: model 'gpt' has no option 'embedd' (options: vocab_size, embed, heads, kv_heads, "
            "head_dim, mlp, layers, rope_theta, norm, scan_layers, remat, dtype, param_dtype, moe, norm_eps, "
            "tie_embeddings, qkv_bias, out_bias, mlp_bias, mlp_act, mlp_glu, embed_scale, positions, max_positions, "
            "rope_scaling, sliding_window, attn_scale, attention, context_parallel, decode, kernel_order, lora, "
            "moe_layers, qk_norm, "
            "norm_placement, attn_softcap, final_softcap, layer_types, local_rope_theta, local_rope_scaling, "
            "partial_rotary_factor, nope_layers, attn_sinks, mla, attn_gate, linear_attn, linear_layers, "
            "global_head_dim, global_kv_heads, global_k_eq_v, v_norm, per_layer_input, per_layer_vocab, layer_scalar, "
            "kv_shared_layers, shared_wide_mlp); "
            "did you mean 'embed'?",
        ),
        (
            lambda base: base.replace("name: gpt", "name: gtp"),
            [],
            "{f}:2: model.name: unknown model 'gtp' (registered: gpt, mlp); did you mean 'gpt'?",
        ),
        (
            lambda base: base.replace("rules: fsdp", "rules: fsd"),
            [],
            "{f}:10: rules: unknown rule preset 'fsd' (presets: dp, ep, fsdp, fsdp_cp, fsdp_tp, pp, pp_fsdp, seq, "
            "tp); did "
            "you mean 'fsdp'?",
        ),
        (
            lambda base: base.replace("rules: fsdp", "rules:\n  - [embed]\n"),
            [],
            "{f}:11: rules[0]: a rule is a pair [logical_name, mesh_axes], got ['embed']",
        ),
        (
            lambda base: base.replace("rules: fsdp", "rules: 3"),
            [],
            "{f}:10: rules: rules must be a preset name (dp, ep, fsdp, fsdp_cp, fsdp_tp, pp, pp_fsdp, seq, tp), "
            "a list of "
            "[logical, mesh_axes] pairs, or {preset: NAME, extra: [...]}; got int",
        ),
        (
            lambda base: base.replace("mesh:\n  shape: {data: 1, fsdp: -1, tensor: 1}\n  devices: 8\n", ""),
            [],
            "{f}: missing required section 'mesh'",
        ),
        (
            lambda base: base + "on_indivisible: replicat\n",
            [],
            "{f}:11: on_indivisible: must be one of error, replicate, got 'replicat'; did you mean 'replicate'?",
        ),
        (lambda base: base + "mesh:\n  devices: 4\n", [], "{f}:11: mesh: key appears twice (first at line 7)"),
        (lambda base: "model: [gpt\n", [], "{f}:2: invalid YAML: expected ',' or ']', but got '<stream end>'"),
        (lambda base: base, ["train.steps"], "--set train.steps: expected KEY=VALUE, e.g. train.steps=100"),
        (lambda base: base, ["trian.steps=3"], "--set trian.steps=3: unknown key 'trian'; did you mean 'train'?"),
    ],
    ids=lambda v: "edit" if callable(v) else None,
)
def test_config_errors(write, base_config, edit, overrides, expected):
    path = write("run.yaml", edit(base_config))
    with pytest.raises(pt.ConfigError) as e:
        # Model options are checked where the models are known: when the model is built.
        model_from_config(load_config(path, overrides))
    assert str(e.value) == expected.replace("{f}", str(path))


def test_override_errors_point_at_the_flag(write, base_config):
    path = write("run.yaml", base_config)
    with pytest.raises(pt.ConfigError) as e:
        load_config(path, ["rules=tpp"])
    assert str(e.value) == (
        f"{path} (--set rules=tpp): rules: unknown rule preset 'tpp' (presets: dp, ep, fsdp, fsdp_cp, fsdp_tp, pp, "
        "pp_fsdp, "
        "seq, tp); "
        "did you mean 'tp'?"
    )
    with pytest.raises(pt.ConfigError, match=r"\(--set train.steps=x\): train.steps: expected int, got str 'x'"):
        load_config(path, ["train.steps=x"])


def test_null_overrides_are_none(write, base_config):
    """`--set k=null` (any YAML 1.2 null) sets None, not an empty mapping; `k=` too."""
    path = write("run.yaml", base_config)
    for null in ("null", "~", "NULL", ""):
        cfg = load_config(path, ["train.microbatches=4", f"train.microbatches={null}", f"optimizer_rules={null}"])
        assert cfg.train.microbatches is None and cfg.optimizer_rules is None


def test_missing_file(tmp_path):
    with pytest.raises(pt.ConfigError, match=r"nope.yaml: no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_missing_rules_file(write, base_config):
    path = write("run.yaml", base_config.replace("rules: fsdp", "rules: missing.yaml"))
    with pytest.raises(pt.ConfigError, match=r"run.yaml:10: rules: no such rules file 'missing.yaml'"):
        load_config(path)


def test_base_and_set_merge_alike_and_replace_the_mesh_shape_whole(write, base_config, repo):
    """One semantics for `base:` and `--set`: a mapping merges key by key, except mesh.shape (its axes are
    ordered), the rule tables, and a mapping naming another thing to build (_target_, the model's name)."""
    write("base.yaml", base_config + "train: {steps: 7, batch_size: 16}\n")
    derived = write(
        "derived.yaml", "base: base.yaml\nmesh: {shape: {data: 1, tensor: -1}}\nrules: tp\ntrain: {steps: 9}\n"
    )
    cfg = load_config(derived)
    assert cfg.mesh.shape == {"data": 1, "tensor": -1} and cfg.mesh.devices == 8  # replaced; devices inherited
    assert (cfg.train.steps, cfg.train.batch_size) == (9, 16)  # merged
    assert cfg.where("mesh", "shape") == f"{derived}:2: mesh.shape"
    same = load_config(write("plain.yaml", base_config), ["mesh={shape: {data: 1, tensor: -1}}", "rules=tp"])
    assert same.mesh.shape == cfg.mesh.shape and same.mesh.devices == 8
    over = load_config(derived, ["train={seq_len: 32}", "mesh.shape.tensor=4"])
    assert (over.train.steps, over.train.batch_size, over.train.seq_len) == (9, 16, 32)
    assert over.mesh.shape == {"data": 1, "tensor": 4}  # one axis set by its dotted key
    assert over.where("train", "seq_len").endswith("(--set train={seq_len: 32}): train.seq_len")
    # Another model replaces the options of the old one; the same model merges them.
    assert load_config(derived, ["model={name: mlp}"]).model_options == {}
    assert load_config(derived, ["model={mlp: 256}"]).model_options["embed"] == 64
    # The shipped tp config: the quickstart's keys, its own mesh.
    tp = load_config(repo / "configs" / "tp.yaml")
    assert tp.mesh.shape == {"data": -1, "tensor": 4} and tp.train.steps == 200 and tp.run_dir == "runs/tp"


@pytest.mark.parametrize("preset", ["dp", "fsdp", "tp", "fsdp_tp", "seq", "pp", "pp_fsdp", "ep"])
def test_each_preset_mesh_fits_the_config_it_sits_beside(repo, preset):
    """The mesh a preset declares (the docs' presets table shows it) fits the quickstart on 8 devices (ep: the
    MoE config), with every axis used."""
    from partitioning.config.planning import plan_from_config
    from partitioning.rules import table_mesh
    from partitioning.yamlfile import load_value

    mesh = table_mesh(preset)
    config = repo / "configs" / ("moe.yaml" if preset == "ep" else "quickstart.yaml")
    cfg = load_config(config, [f"rules={preset}", f"mesh.shape={fmt_mesh(mesh)}"])
    plan, _ = plan_from_config(cfg, 8)
    assert plan.errors == [] and load_value(fmt_mesh(mesh)) == mesh
    assert all(s > 1 for s in plan.mesh.values() if s != plan.mesh.get("data")), plan.mesh
