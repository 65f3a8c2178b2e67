"""The registry: one adapter per module, each carrying its own facts, and where each adapter came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfla_bench.adapters import availability_cache, registry
from tfla_bench.adapters.registry import Adapter, PlotStyle, PublishedSeries
from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse import published
from tfla_bench.plots.style import base_style, row_style


def built_in_adapters() -> list[Adapter]:
    return [a for a in registry.adapters() if a.origin.startswith("built-in ")]


def test_every_built_in_module_defines_at_most_one_adapter_and_is_its_origin():
    by_module: dict[str, list[str]] = {}
    for adapter in built_in_adapters():
        by_module.setdefault(type(adapter).__module__, []).append(adapter.name)
        assert adapter.origin == f"built-in {type(adapter).__module__}"
    assert all(len(names) == 1 for names in by_module.values()), by_module
    assert len(by_module) == 19
    walked = {m for p in registry.BUILT_IN_PACKAGES for m in registry.adapter_modules(p)}
    assert set(by_module) <= walked and "tfla_bench.baselines._attention" in walked


def test_built_in_adapters_carry_their_plot_style_gate_shape_and_published_series():
    for adapter in built_in_adapters():
        assert adapter.plot_style is not None and adapter.plot_style.color.startswith("#"), adapter.name
        assert row_style(adapter.name, adapter.family).color == adapter.plot_style.color
    assert registry.get("tfla_sig").plot_style == PlotStyle("#6a3d9a", "-", "o")
    assert registry.get("mamba2").gate_shape.chunk_size == 128
    assert registry.get("gla").gate_shape.head_dim_v == 128
    assert registry.get("sdpa_cudnn").published.params == {"causal": False}
    assert registry.get("fa3").param_defaults == {"causal": True}
    assert registry.get("mlstm_kernels_sig").published.rank > registry.get("tfla_sig").published.rank


def test_an_unknown_kernel_gets_a_stable_style_from_its_family():
    assert registry.find("no_such_kernel") is None and base_style("no_such_kernel") is None
    assert row_style("no_such_kernel", "gla") == row_style("no_such_kernel", "gla")
    assert row_style("no_such_kernel", "gla").linestyle == "-"


class _Linear(Adapter):
    family = "test"
    cpu_capable = True

    def flops(self, case: Case, mode: str) -> float:
        return 1.0

    def bytes(self, case: Case, mode: str) -> float:
        return 1.0


@pytest.fixture
def scratch_registry(monkeypatch):
    registry.load()
    monkeypatch.setattr(registry, "_ADAPTERS", dict(registry._ADAPTERS))


def test_a_new_adapter_joins_the_published_mapping_and_the_plots_by_itself(scratch_registry):
    @registry.register
    class Peer(_Linear):
        name = "test_gla_peer"
        published = PublishedSeries("chunk_gla", note="fla chunk_gla (GLA, per-channel gate)", rank=1)
        param_defaults = {"causal": True}
        plot_style = PlotStyle("#123456", "--", "D")

    assert published.mapping_for_published("chunk_gla").adapters == ("gla", "test_gla_peer")
    assert published.mapping_for_adapter("test_gla_peer").published_kernel == "chunk_gla"
    assert published.param_default("test_gla_peer", "causal") is True
    assert published.param_default("not_registered", "causal") is None
    assert base_style("test_gla_peer") == PlotStyle("#123456", "--", "D")
    assert registry.get("test_gla_peer").origin == f"module {__name__}"


def test_origin_of_an_entry_point_and_of_a_plugins_env_module(scratch_registry, monkeypatch, tmp_path):
    (tmp_path / "origin_adapters_for_test.py").write_text(
        "from test_registry import _Linear\nfrom tfla_bench.adapters.registry import register\n\n"
        "@register\nclass FromEnv(_Linear):\n    name = 'test_from_env'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PLUGINS_ENV, "origin_adapters_for_test")
    monkeypatch.delitem(sys.modules, "origin_adapters_for_test", raising=False)
    assert registry.get("test_from_env").origin == "TFLA_BENCH_PLUGINS origin_adapters_for_test"

    class Entry:
        name = "thirdparty"
        value = "thirdparty.adapters:setup"

        def load(self):
            def setup():
                @registry.register
                class FromEntryPoint(_Linear):
                    name = "test_from_entry_point"

            return setup

    monkeypatch.setattr(registry, "entry_points", lambda group: [Entry()])
    registry.load_entry_points()
    origin = "entry point thirdparty = thirdparty.adapters:setup"
    assert registry.get("test_from_entry_point").origin == origin


def test_a_built_in_module_imported_before_load_is_still_built_in():
    assert registry._origin_of_module("tfla_bench.baselines.gla") == "built-in tfla_bench.baselines.gla"
    assert registry._origin_of_module("my_package.adapters") == "module my_package.adapters"


@pytest.mark.parametrize("name", ["tfla_sig", "tfla_exp", "limit_chunk"])
def test_the_interpreter_runs_our_kernels_in_float32_and_refuses_bfloat16_in_one_line(monkeypatch, name):
    from tfla_bench.run import correctness

    adapter = registry.get(name)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert correctness.gate_dtype(adapter) == "float32"
    bf16 = correctness.gate_case(adapter, "bfloat16")
    reason = adapter.check(bf16)
    assert "interpreter" in reason and "bfloat16" in reason and "\n" not in reason
    assert adapter.check(correctness.gate_case(adapter)) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert correctness.gate_dtype(adapter) == "bfloat16"


@pytest.mark.parametrize("name", ["tfla_sig", "tfla_exp", "limit_chunk"])
def test_our_kernels_run_on_the_cpu_under_the_interpreter_and_say_it(monkeypatch, name):
    import torch  # only to tell which machine this is

    adapter = registry.get(name)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert adapter.cpu_capable and adapter.available() is None
    assert "no speed claim" in adapter.row_note()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not adapter.cpu_capable and adapter.row_note() == ""
    if not torch.cuda.is_available():
        assert "CUDA not available" in adapter.available() and "TRITON_INTERPRET=1" in adapter.available()


PROBED = """
from tfla_bench.adapters.registry import Adapter, register


class _Probed(Adapter):
    family = "test"

    def flops(self, case, mode):
        return 1.0

    def bytes(self, case, mode):
        return 1.0


@register
class Here(_Probed):
    name = "test_probe_here"


@register
class Missing(_Probed):
    name = "test_probe_missing"

    def available(self):
        return "needs the package frobnicate"


@register
class Raising(_Probed):
    name = "test_probe_raising"

    def available(self):
        raise RuntimeError("probe broke")
"""


def test_availability_side_by_side_matches_asking_here(scratch_registry, monkeypatch, tmp_path):
    (tmp_path / "probed_adapters_for_test.py").write_text(PROBED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "probed_adapters_for_test", raising=False)
    __import__("probed_adapters_for_test")

    @registry.register
    class OnlyHere(_Linear):  # its module does not register it: a pool process cannot find it
        name = "test_probe_only_here"

        def available(self):
            return "asked in the calling process"

    chosen = [registry.get(name) for name in ("test_probe_here", "test_probe_missing", "test_probe_raising")]
    chosen += [registry.get("test_probe_only_here"), registry.get("sdpa_math"), registry.get("fa3")]
    expected = {
        "test_probe_here": None,
        "test_probe_missing": "needs the package frobnicate",
        "test_probe_raising": "available() raised RuntimeError: probe broke",
        "test_probe_only_here": "asked in the calling process",
        "sdpa_math": registry.get("sdpa_math").available(),
        "fa3": registry.get("fa3").available(),
    }
    assert registry.availability(chosen, processes=1, fresh=True) == expected
    assert registry.availability(chosen, processes=2, fresh=True) == expected


ASKED = """
import importlib
import os

from tfla_bench.adapters.registry import Adapter, register


@register
class Asked(Adapter):
    name = "test_asked"
    family = "test"

    def available(self):
        with open(os.environ["TFLA_TEST_ASKED_LOG"], "a") as log:
            log.write("asked\\n")
        importlib.invalidate_caches()
        return None if importlib.util.find_spec("frobnicate") else "needs the package frobnicate"

    def flops(self, case, mode):
        return 1.0

    def bytes(self, case, mode):
        return 1.0
"""


class Asked:
    """The counting stand-in adapter `test_asked` (a `TFLA_BENCH_PLUGINS` module): available only
    while the package `frobnicate` is installed into `site`, a folder on `sys.path`."""

    def __init__(self, folder):
        self.module = folder / "asked_adapter_for_test.py"
        self.log = folder / "asked.log"
        self.site = folder / "site"
        self.site.mkdir()
        self.module.write_text(ASKED)

    def answer(self, **options) -> str | None:
        return registry.availability([registry.get("test_asked")], **options)["test_asked"]

    def times_asked(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def install(self):
        (self.site / "frobnicate").mkdir()
        (self.site / "frobnicate" / "__init__.py").write_text("")
        (self.site / "frobnicate-1.0.dist-info").mkdir()
        (self.site / "frobnicate-1.0.dist-info" / "METADATA").write_text("Name: frobnicate\nVersion: 1.0\n")

    def uninstall(self):
        for path in ("frobnicate/__init__.py", "frobnicate-1.0.dist-info/METADATA"):
            (self.site / path).unlink()
        (self.site / "frobnicate").rmdir()
        (self.site / "frobnicate-1.0.dist-info").rmdir()


@pytest.fixture
def asked(scratch_registry, monkeypatch, tmp_path):
    stand_in = Asked(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(stand_in.site))
    monkeypatch.delitem(sys.modules, "asked_adapter_for_test", raising=False)
    monkeypatch.delitem(sys.modules, "frobnicate", raising=False)
    monkeypatch.setenv(registry.PLUGINS_ENV, "asked_adapter_for_test")
    monkeypatch.setenv("TFLA_TEST_ASKED_LOG", str(stand_in.log))
    return stand_in


def test_an_unchanged_key_asks_no_adapter_again(asked, availability_cache_file):
    assert asked.answer() == "needs the package frobnicate" and asked.times_asked() == 1
    assert asked.answer() == "needs the package frobnicate" and asked.times_asked() == 1
    stored = json.loads(availability_cache_file.read_text())["adapters"]["test_asked"]
    assert stored["reason"] == "needs the package frobnicate"
    assert stored["adapter"] == "asked_adapter_for_test.Asked" and time.time() - stored["asked_at"] < 600
    answers = registry.availability_answers([registry.get("test_asked"), registry.get("sdpa_math")])
    assert asked.times_asked() == 1 and answers.cached_since == pytest.approx(stored["asked_at"])
    assert answers.cached == {"test_asked"}
    assert registry.availability_answers([registry.get("test_asked")]).cached_since is not None
    assert asked.answer(fresh=True) == "needs the package frobnicate" and asked.times_asked() == 2


def test_the_spawned_processes_answers_are_kept_too(asked):
    chosen = [registry.get("test_asked"), registry.get("sdpa_math")]
    first = registry.availability(chosen, processes=2)
    assert registry.availability(chosen, processes=2) == first and asked.times_asked() == 1


def test_installing_or_uninstalling_a_package_asks_again(asked):
    assert asked.answer() == "needs the package frobnicate"
    asked.install()
    assert asked.answer() is None and asked.times_asked() == 2
    assert asked.answer() is None and asked.times_asked() == 2
    asked.uninstall()  # never reported available from the cache once its library is gone
    assert asked.answer() == "needs the package frobnicate" and asked.times_asked() == 3


def test_a_reinstalled_distribution_asks_again(asked):
    asked.install()
    assert asked.answer() is None and asked.times_asked() == 1
    folder = asked.site / "frobnicate-1.0.dist-info"
    stamp = folder.stat().st_mtime_ns
    os.utime(folder, ns=(stamp + 10**9, stamp + 10**9))
    assert asked.answer() is None and asked.times_asked() == 2


def test_a_changed_adapter_source_asks_that_adapter_again(asked):
    asked.answer()
    asked.module.write_text(ASKED.replace("needs the package", "wants the package"))
    # A new process imports the new source: so does the registry here.
    del sys.modules["asked_adapter_for_test"], registry._ADAPTERS["test_asked"]
    assert asked.answer() == "wants the package frobnicate" and asked.times_asked() == 2


def test_a_change_in_the_gpus_visible_asks_again(asked, monkeypatch, tmp_path):
    devices = tmp_path / "dev"
    devices.mkdir()
    monkeypatch.setattr(availability_cache, "DEVICE_DIR", devices)
    asked.answer()
    (devices / "nvidia0").touch()
    (devices / "nvidiactl").touch()
    asked.answer()
    assert asked.times_asked() == 2 and availability_cache.visible_gpus() == ["nvidia0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    asked.answer()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    asked.answer()
    asked.answer()
    assert asked.times_asked() == 4


@pytest.mark.parametrize(
    "content",
    ['{"version": 1, "key": 3}', "", " \n", '{"version": 1, "adapters": {"x": 1}}', '{"version": []}'],
)
def test_a_corrupt_cache_is_asked_afresh_and_rewritten(asked, availability_cache_file, content):
    asked.answer()
    stored = json.loads(availability_cache_file.read_text())
    availability_cache_file.write_text(content)
    assert asked.answer() == "needs the package frobnicate" and asked.times_asked() == 2
    assert json.loads(availability_cache_file.read_text())["key"] == stored["key"]
    stored["adapters"]["test_asked"]["asked_at"] = "yesterday"
    availability_cache_file.write_text(json.dumps(stored))
    asked.answer()
    assert asked.times_asked() == 3
    asked.answer()
    assert asked.times_asked() == 3


@pytest.mark.parametrize(
    "content", ["kernel,mode\nsdpa_math,fw\n", "{not json", '["a list"]', '{"adapters": {}}']
)
def test_a_named_file_that_holds_no_cache_is_never_replaced(asked, availability_cache_file, capsys, content):
    """`$TFLA_BENCH_AVAILABILITY_FILE` naming a file of the user's (a run's results.csv): the answers
    stand, the file stays as it was, and one warning says why nothing is saved."""
    availability_cache_file.write_text(content)
    assert asked.answer() == "needs the package frobnicate"
    assert availability_cache_file.read_text() == content
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and f"{availability_cache_file}: holds no availability record; left as it is" in err
    )


def test_the_default_cache_file_is_rewritten_whatever_it_holds(asked, monkeypatch, tmp_path):
    monkeypatch.delenv(availability_cache.CACHE_FILE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    default = tmp_path / "tfla-bench" / "availability.json"
    default.parent.mkdir()
    default.write_text("{not json")
    asked.answer()
    assert json.loads(default.read_text())["version"] == availability_cache.FORMAT_VERSION


def test_an_unwritable_cache_still_answers(asked, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(availability_cache.CACHE_FILE_ENV, str(tmp_path / "a-file" / "availability.json"))
    assert asked.answer() == "needs the package frobnicate"
    assert asked.answer() == "needs the package frobnicate" and asked.times_asked() == 2


def test_the_cache_lives_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(availability_cache.CACHE_FILE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert availability_cache.cache_path() == tmp_path / "tfla-bench" / "availability.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert availability_cache.cache_path() == Path.home() / ".cache" / "tfla-bench" / "availability.json"


def test_the_console_script_and_python_c_share_the_key(tmp_path):
    # `make gpu` runs `check` as `python -c "... main()"` in the checkout, a user `tfla-bench list`.
    printing = (
        "from tfla_bench.adapters import availability_cache as c\nprint(c.key_digest(c.machine_key()))\n"
    )
    script = tmp_path / "bin" / "tfla-bench-key"
    script.parent.mkdir()
    script.write_text(printing)
    repo = Path(__file__).resolve().parent.parent
    keys = [
        subprocess.run(command, capture_output=True, text=True, check=True, cwd=repo).stdout
        for command in ([sys.executable, str(script)], [sys.executable, "-c", printing])
    ]
    assert keys[0] == keys[1] and len(keys[0].strip()) == 64


def test_the_key_imports_no_library():
    script = (
        "import sys\n"
        "from tfla_bench.adapters import availability_cache\n"
        "availability_cache.key_digest(availability_cache.machine_key())\n"
        "heavy = ('torch', 'numpy', 'pandas', 'matplotlib', 'triton')\n"
        "print(*[name for name in heavy if name in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == []
