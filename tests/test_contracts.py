"""Contracts between the engine and its readers, checked on the real engine (never on hand-made
shapes): the typed EngineInfo, and every declared toggle reaching GenerationConfig from each door."""

from __future__ import annotations

import pytest
from support import ask

from engine.cli import build_parser, generation_config_from_args
from engine.core.config import SAMPLING, TOGGLE, TOGGLES, GenerationConfig
from engine.core.errors import InvalidRequest
from engine.core.info import EngineInfo
from engine.remote.wire import FORWARDED, request_body
from server import protocol
from server.protocol import parse_chat_request
from ui.chat import controls as pane_controls
from ui.shell import controls
from ui.shell import engine_info, glossary
from ui.chat import records, settings
from ui.compare.tab import preset_missing, preset_settings
from ui.shell.presets import QUANT_VARIANT, load_prompt_sets, teaching_presets

HI = [{"role": "user", "content": "hi"}]


def non_default(t):
    """A value of toggle `t` that differs from its default and that it accepts."""
    if t.kind == "bool":
        return not t.default
    if t.kind == "int":
        return t.default + 1 if t.hi is None or t.default < t.hi else t.default - 1
    if t.kind == "choice":
        return next(c for c in t.choices if c != t.default)
    if t.kind == "variant":
        return "int8wo"
    raise AssertionError(f"no test value for kind {t.kind}")


def test_every_toggle_is_declared_well():
    assert {t.name for t in TOGGLES} >= {"kv_reuse", "speculative", "num_speculative_tokens",
                                         "speculative_adaptive", "quantization", "chunked_prefill"}
    for t in (*TOGGLES, *settings.PAGE_SETTINGS):
        t.check(t.default) if t.kind != "variant" else t.check(None)
        assert t.label and t.help, t.name
        assert t.glossary is None or t.glossary in glossary.METRICS, f"{t.name}: no glossary entry {t.glossary}"
        assert t.only_with is None or t.only_with.partition("=")[0] in {u.name for u in (*TOGGLES, *settings.PAGE_SETTINGS)}
        assert t.name in settings.FIELDS


@pytest.mark.parametrize("t", TOGGLES, ids=lambda t: t.name)
def test_each_toggle_reaches_the_config_from_every_door(t):
    value = non_default(t)
    # the API, as the openai SDK's extra_body sends it
    api = parse_chat_request({"messages": HI, t.name: value}).config
    # the page's endpoint
    page = settings.PaneSettings.read({t.name: value}).config
    # the CLI
    if t.kind == "bool":
        argv = ["hi", ("--no-" + t.cli_flag[2:]) if t.default else t.cli_flag]
    else:
        argv = ["hi", t.cli_flag, str(value)]
    cli = generation_config_from_args(build_parser().parse_args(argv))
    # a remote Latency Lab: what our remote engine sends is what our API reads back
    sent = request_body("m", HI, GenerationConfig(**{t.name: value}), None, send_toggles=True)
    remote = parse_chat_request(sent).config
    for via, config in (("api", api), ("page", page), ("cli", cli), ("remote", remote)):
        assert getattr(config, t.name) == value, f"{t.name} lost on the way through the {via}"
    assert (t.name in FORWARDED) == ("remote-lab" in t.backends)


API_NAMES = {"max_new_tokens": "max_tokens"}  # OpenAI's name; every other field goes by its own


def bounds(t):
    """(values at the declared bounds, each accepted; values just outside them, each refused)."""
    if t.kind == "int":
        return [b for b in (t.lo, t.hi) if b is not None], [b + d for b, d in ((t.lo, -1), (t.hi, 1)) if b is not None]
    if t.kind == "float":
        low = t.lo + t.step if t.lo_open else t.lo
        return [low, t.hi], [t.lo if t.lo_open else t.lo - t.step, t.hi + t.step]
    if t.kind == "strings":
        return [("x" * t.max_chars,) * t.hi], [("",), ("x",) * (t.hi + 1), ("x" * (t.max_chars + 1),)]
    return [], []


def cli_args(t, value) -> list[str]:
    if t.kind == "strings":
        return [arg for s in value for arg in (t.cli_flag, s)]
    return [t.cli_flag, str(value)]


@pytest.mark.parametrize("t", (*SAMPLING, *TOGGLES), ids=lambda t: t.name)
def test_every_door_takes_its_default_and_bounds_from_the_declaration(t, bundled_engine):
    """The CLI flags, the API's body and the page's controls and endpoint: each starts from the field's
    declared default, accepts its bounds and refuses just past them, naming the field."""
    import gradio as gr

    api_name = API_NAMES.get(t.name, t.name)
    wire = (lambda v: list(v)) if t.kind == "strings" else (lambda v: v)
    cli = generation_config_from_args(build_parser().parse_args(["hi"]))
    assert getattr(GenerationConfig(), t.name) == getattr(cli, t.name) == t.default
    assert getattr(parse_chat_request({"messages": HI}).config, t.name) == t.default
    if t.page:
        assert settings.defaults()[t.name] == t.default == getattr(settings.PaneSettings.read(settings.defaults()).config, t.name)
    accepted, refused = bounds(t)
    for value in accepted:
        assert getattr(parse_chat_request({"messages": HI, api_name: wire(value)}).config, t.name) == value
        assert getattr(generation_config_from_args(build_parser().parse_args(["hi", *cli_args(t, value)])), t.name) \
            == value
        if t.page:
            assert getattr(settings.PaneSettings.read({t.name: value}).config, t.name) == value
    for value in refused:
        with pytest.raises(InvalidRequest) as err:
            parse_chat_request({"messages": HI, api_name: wire(value)})
        assert err.value.param == api_name and api_name in str(err.value), value
        with pytest.raises(InvalidRequest) as err:
            generation_config_from_args(build_parser().parse_args(["hi", *cli_args(t, value)]))
        assert err.value.param == t.name
        if t.page and not (t.name == "seed" and value in settings.RANDOM_SEED):
            with pytest.raises(InvalidRequest) as err:
                settings.PaneSettings.read({t.name: value})
            assert err.value.param == t.name
    if t.page and t.kind in ("int", "float"):
        info = bundled_engine.info()
        control = controls.toggle_control(t, "t", info)
        assert control.value == t.default
        if isinstance(control, gr.Slider):  # its range: the declared one (max tokens: up to the model's context)
            assert control.minimum == (accepted[0] if accepted else t.lo)
            assert control.maximum == (t.hi if t.hi is not None else info.context_max)
            assert control.step == (t.step or 1)
        else:
            assert isinstance(control, gr.Number) and (control.minimum, control.maximum) == (t.lo, t.hi)


def test_each_pane_starts_from_the_declarations_and_its_named_overrides(bundled_engine):
    import gradio as gr

    for overrides in (settings.CHAT_PANE, settings.AB_PANE):
        with gr.Blocks():
            made = dict(zip(settings.FIELDS, pane_controls.settings_controls("t", bundled_engine.info(), ["local"],
                                                                         **overrides)))
        for t in settings.ON_PAGE:
            assert made[t.name].value == overrides.get(t.name, t.default), t.name
    assert settings.AB_PANE == {"temperature": 0.0, "max_new_tokens": 64}  # greedy and short: comparable panes


def test_an_unknown_api_field_is_refused_by_name_and_documented_ones_are_ignored():
    with pytest.raises(InvalidRequest) as err:
        parse_chat_request({"messages": HI, "kv_reuse_please": True})
    assert err.value.param == "kv_reuse_please" and "kv_reuse_please" in str(err.value)
    assert parse_chat_request({"messages": HI, "user": "someone", "metadata": {}}).config == GenerationConfig()


def test_engine_info_is_typed_and_travels_as_json(bundled_engine):
    info = bundled_engine.info()
    assert isinstance(info, EngineInfo)
    assert EngineInfo.from_dict(info.to_dict()) == info
    assert info.default_variant.name == info.dtype and info.context_max > 0
    assert set(info.toggles) == {t.name for t in TOGGLES}
    assert info.capabilities["isa_level"] and info.capabilities["torch_cpu_capability"]


def test_the_page_offers_exactly_the_variants_the_engine_runs(bundled_engine):
    info = bundled_engine.info()
    offered = [value for _, value in engine_info.variant_choices(info)]
    assert offered[0] == info.default_variant.name  # the loaded weights come first
    assert set(offered) == {v.name for v in info.variants if v.available}
    assert set(offered) <= set(bundled_engine.variants.names())
    for name in offered:  # each choice is one the engine accepts (none is a report's key)
        config = settings.PaneSettings.read({"quantization": name}).config
        assert bundled_engine.variants.check(config.quantization) == name
    assert engine_info.speculation_choices(info) == [s.name for s in info.speculation if s.available]


def test_an_unavailable_choice_is_shown_with_its_reason_not_offered(bundled_engine):
    from dataclasses import replace

    info = bundled_engine.info()
    four = replace(info.variant(QUANT_VARIANT), available=False, reason="needs a kernel this CPU lacks")
    info = replace(info, variants=tuple(four if v.name == QUANT_VARIANT else v for v in info.variants))
    assert QUANT_VARIANT not in [value for _, value in engine_info.variant_choices(info)]
    assert f"{QUANT_VARIANT} — needs a kernel this CPU lacks" in engine_info.unavailable_note(info.variants)
    presets = teaching_presets(load_prompt_sets())
    assert "cannot run here: needs a kernel" in preset_missing(presets["quantization"], info)


def test_every_preset_sets_only_declared_fields_with_values_the_page_offers(bundled_engine):
    info = bundled_engine.info()
    offered = {value for _, value in engine_info.variant_choices(info)}
    for name, preset in teaching_presets(load_prompt_sets()).items():
        for side in ("a", "b"):
            chosen = preset_settings(preset, side, info)
            assert set(chosen) <= set(settings.FIELDS), name
            assert chosen["quantization"] in offered, name
            settings.PaneSettings.read(chosen)  # valid as the page will send it
        if name == "compiled_step" and "compiled_decode" in info.unavailable_toggles:
            assert "cannot run here" in preset_missing(preset, info)  # e.g. no C++ compiler: said, not offered
        elif preset.get("needs_variant") and info.variant(preset["needs_variant"]).kernel_fallback:
            assert "cannot run here" in preset_missing(preset, info)  # none of our kernels: said, not taught slow
        else:
            assert preset_missing(preset, info) is None, name


def test_the_quantization_preset_runs_the_default_weights_against_the_integer_kernel_variant(bundled_engine):
    """A: the weights as loaded; B: QUANT_VARIANT, the one name the preset reads (B's weights, what it
    needs, its text); its text says what to see: decode rate, quality measured, the first token's cost.
    Here, where the plan's rule gives our integer kernels a form, it runs."""
    from engine.kernels import cpu_qdot
    from engine.platform import capabilities
    from engine.quant.quantize import METHODS, RETIRED

    info = bundled_engine.info()
    preset = teaching_presets(load_prompt_sets())["quantization"]
    assert QUANT_VARIANT in METHODS and QUANT_VARIANT not in RETIRED
    assert preset_settings(preset, "a", info)["quantization"] == info.default_variant.name
    assert preset_settings(preset, "b", info)["quantization"] == preset["needs_variant"] == QUANT_VARIANT
    assert set(preset["a"]) == set(preset["b"]) == {"quantization"}  # one thing changes
    text = preset["explain"]
    assert QUANT_VARIANT in preset["title"] and QUANT_VARIANT in text
    for said in ("decode rate", "measured, not assumed", "first turn", "TTFT"):
        assert said in text, said
    runs_here = cpu_qdot.best_form(capabilities.detect()) is not None
    assert (info.variant(QUANT_VARIANT).kernel_fallback is None) == runs_here
    assert (preset_missing(preset, info) is None) == runs_here


def test_where_the_integer_kernels_cannot_run_the_quantization_preset_says_why(tiny, monkeypatch):
    """Our kernels switched off (as where the extension cannot build): engine info says why a w8a variant
    would run the torch reference, before it is built and after, the page's JSON keeps it, and the
    preset says why it cannot teach here instead of running 4-bit at the reference's pace."""
    from dataclasses import replace

    from engine.serving.variants import VariantSet

    monkeypatch.setenv("LATENCY_LAB_GEMM", "off")
    variants = VariantSet(tiny, budget_bytes=10**10, defer_quality=True)
    preset = teaching_presets(load_prompt_sets())["quantization"]
    for built in (False, True):
        if built:
            variants.get(QUANT_VARIANT)
        infos = {v.name: v for v in variants.infos()}
        why = infos[QUANT_VARIANT].kernel_fallback
        assert infos[QUANT_VARIANT].available and why and "LATENCY_LAB_GEMM=off" in why, (built, why)
        assert infos["int4wo+head"].kernel_fallback is None and infos["int8w8a"].kernel_fallback == why
        info = EngineInfo(name="tiny", source="folder", variants=tuple(infos.values()))
        assert EngineInfo.from_dict(info.to_dict()).variant(QUANT_VARIANT).kernel_fallback == why
        missing = preset_missing(preset, info)
        assert missing and "cannot run here" in missing and why in missing and "Weights" in missing
    monkeypatch.delenv("LATENCY_LAB_GEMM")
    off_cpu = replace(info.variant(QUANT_VARIANT), available=False, reason="run on CPU only, not cuda")
    info = replace(info, variants=(off_cpu,))
    assert "cannot run here: run on CPU only" in preset_missing(preset, info)


def test_a_toggle_the_machine_cannot_run_is_shown_disabled_with_its_reason(tiny_model_dir):
    """No C++ compiler (forced while the engine, so its plan, is made): engine info says why
    compiled_decode cannot run, the page's checkbox is disabled with that reason, and the preset that
    needs it says so instead of failing."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.platform import capabilities
    from engine.serving.service import Engine
    from ui.shell.controls import toggle_control

    with capabilities.forced(cpp_compiler=None):
        engine = Engine(load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False)))
    try:
        info = engine.info()
    finally:
        engine.close()
    why = info.unavailable_toggles["compiled_decode"]
    assert "C++ compiler" in why
    assert EngineInfo.from_dict(info.to_dict()).unavailable_toggles == {"compiled_decode": why}
    box = toggle_control(TOGGLE["compiled_decode"], "A", info)
    assert box.interactive is False and box.value is False and why in box.info
    preset = teaching_presets(load_prompt_sets())["compiled_step"]
    assert why in preset_missing(preset, info)
    assert toggle_control(TOGGLE["kv_reuse"], "A", info).interactive is not False


def test_weights_that_cannot_compile_leave_the_toggle_on_offer_for_the_variants_that_can(tiny_model_dir):
    """bf16 weights as loaded (what an AVX-512 BF16 machine loads): their plain linears cannot take the
    compiled step, int8wo+head / int4wo+head can. The toggle stays on offer with a note on the loaded
    weights, the preset that compiles int4wo+head runs, and a request on the loaded weights is refused
    with what to pick."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.serving.service import Engine
    from ui.shell.controls import toggle_control

    engine = Engine(load(LoadConfig(model=str(tiny_model_dir), dtype="bf16", progress=False)))
    try:
        info = engine.info()
        if engine.variants.default.runner.plan.compiled_machine_reason:  # no C++ compiler: the test above covers it
            assert "compiled_decode" in info.unavailable_toggles
            return
        assert "compiled_decode" not in info.unavailable_toggles
        assert "int4wo+head" in info.default_variant.compiled_refused
        box = toggle_control(TOGGLE["compiled_decode"], "A", info)
        assert box.interactive is not False and "weights as loaded (bf16)" in box.info
        preset = teaching_presets(load_prompt_sets())["compiled_step"]
        assert preset_missing(preset, info) is None
        with pytest.raises(InvalidRequest, match=r"int4wo\+head"):
            engine.complete(ask("hi"), GenerationConfig(temperature=0.0, max_new_tokens=2, compiled_decode=True))
        assert engine.complete(ask("hi"), GenerationConfig(temperature=0.0, max_new_tokens=2)).output_tokens == 2
    finally:
        engine.close()


def test_config_labels_derive_from_the_declarations():
    label = records.config_label({"temperature": 0, "speculative": "prompt_lookup", "num_speculative_tokens": 8,
                                  "quantization": "nf4", "kv_reuse": False})
    assert label == "greedy · no kv reuse · prompt lookup · k=8 · nf4"
    assert records.config_label({"temperature": 0, "num_speculative_tokens": 8}) == "greedy"  # k needs speculation


def test_controls_cover_every_field(bundled_engine):
    import gradio as gr

    with gr.Blocks():
        made = pane_controls.settings_controls("t", bundled_engine.info(), ["local"], **settings.AB_PANE)
    assert len(made) == len(settings.FIELDS)
    ids = [c.elem_id for c in made]
    assert len(set(ids)) == len(ids) and all(i.startswith("lab-t-") for i in ids)


def test_the_readme_toggles_table_names_every_toggle_and_its_flag():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for t in TOGGLES:
        flag = ("--no-" + t.cli_flag[2:]) if t.kind == "bool" and t.default else t.cli_flag
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{t.name}`")), None)
        assert row is not None, f"README's toggles table has no row for {t.name}"
        assert flag in row and t.label in row, f"README row for {t.name} lacks {flag} or *{t.label}*"


PROBES = [None, True, False, 0, 1, -1, 2, 16, 17, 2**63, 0.0, 0.5, 1.0, 2.5, 1e308, float("nan"), "", "off", "x",
          "draft", "int8wo", [], ["a"], [""], ["a"] * 9, [1], {}]


@pytest.mark.parametrize("name", sorted(protocol.DECLARED), ids=str)
def test_the_body_model_and_the_declaration_agree_on_every_value(name):
    """pydantic's type for a declared field (server/protocol.py) takes exactly what the declaration
    takes, and every refusal is in the declaration's words (none falls back to pydantic's)."""
    t = protocol.DECLARED[name]
    for value in PROBES:
        try:
            t.check(protocol._body_value({name: value}, name), name)
            declared = None
        except InvalidRequest as exc:
            declared = str(exc)
        if value is None:
            declared = None  # an absent field: the default
        try:
            parse_chat_request({"messages": HI, name: value})
            heard = None
        except InvalidRequest as exc:
            heard = str(exc)
            assert exc.param == name
        if t.kind == "strings" and not isinstance(value, (str, list, type(None))):
            assert heard == f"{name} must be a string or a list of strings"  # OpenAI's stop: one string or a list
        else:
            assert heard == declared, (name, value)


@pytest.mark.parametrize("body, message", [
    ([1], "the request body must be a JSON object"),
    ({"messages": HI, "model": 5, "zz": 1}, "model must be a string"),
    ({"messages": [], "zz": 1, "aa": 2}, "unknown field 'aa': this server reads the OpenAI chat fields and its "
                                         "toggles (" + ", ".join(protocol.TOGGLES) + ")"),
    ({"messages": [], "temperature": -1}, "messages must be a non-empty list of {role, content} objects"),
    ({"messages": HI, "stream_options": {"include_usage": 1}}, "include_usage must be true or false"),
    ({"messages": HI, "tools": [{}], "n": 2}, "tools is not supported by this server"),
    ({"messages": HI, "n": True}, "only n=1 is supported"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens must be at least 1, not 0"),
    ({"messages": HI, "max_completion_tokens": 2.5}, "max_completion_tokens must be an integer, not 2.5"),
    ({"messages": HI, "temperature": 3, "top_p": 0}, "temperature must be >= 0.0 and <= 2.0, not 3"),
    ({"messages": HI, "stop": ["x"] * 9}, "at most 8 stop strings are allowed"),
    ({"messages": HI, "session": ""}, "session must be a string of 1 to 200 characters"),
])
def test_the_api_refuses_a_body_in_its_own_words(body, message):
    """Several faults: the one in the first field (in the order the API has always checked them)."""
    with pytest.raises(InvalidRequest) as err:
        parse_chat_request(body)
    assert str(err.value) == message
