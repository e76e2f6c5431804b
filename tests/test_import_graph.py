"""The packages' imports, read with ``ast`` (``tests/import_graph.py``): no circle inside a package,
every import points down the chain autoplan_base <- hardware_specs <- profiles <- costmodels <- planner,
no module takes another's private names, planner's sub-packages import down their own order, and ``planner/`` keeps a small top level."""

from import_graph import LAYERS, PLANNER_LAYERS, REPO, cycles, edges, modules, planner_layer, private_uses


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_the_graph_sees_every_kind_of_import():
    graph = edges()
    assert "costmodels.layout" in graph["costmodels.estimate"]  # module level, relative
    assert "autoplan_base.errors" in graph["planner.api"]  # absolute
    assert "planner.plan.render" in graph["planner.search.infeasible"]  # inside a function
    assert "planner.launch.torchjob.trainer" in graph["planner.validate.dryrun"]  # `from package import module`
    assert "costmodels.context" in graph["costmodels.rank_time"]  # under TYPE_CHECKING


def test_no_package_has_an_import_circle():
    assert cycles(edges()) == []


def test_a_planted_circle_is_found():
    graph = {**edges(), "costmodels.layout": edges()["costmodels.layout"] | {"costmodels.estimate"}}
    assert any("costmodels.estimate" in c and "costmodels.layout" in c for c in cycles(graph))


def test_imports_point_down_the_package_chain():
    upward = [f"{a} -> {b}" for a, targets in edges().items() for b in targets if _layer(b) > _layer(a)]
    assert upward == []


def test_planner_sub_packages_import_down_their_order():
    """``planner.search`` imports neither Alpa's passes nor the launcher; the API no command line."""
    inside = [(a, b) for a, targets in edges().items() for b in targets
              if a.startswith("planner.") and b.startswith("planner.")]
    upward = [f"{a} -> {b}" for a, b in inside if planner_layer(b) > planner_layer(a)]
    assert upward == []
    assert planner_layer("planner.search.stages") < planner_layer("planner.alpa.shard") < planner_layer("planner.cli.plan")
    assert planner_layer("planner.api") == PLANNER_LAYERS.index("")


def test_no_module_imports_private_names_of_another():
    assert private_uses() == []


def test_a_planted_private_use_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from costmodels.bounds import _core_sums_key, core_sums\n"
                       "from costmodels import bounds\n\n\ndef f():\n    return bounds._vector\n")
    found = private_uses({**modules(), "costmodels.planted": planted})
    assert "costmodels.planted: costmodels.bounds._core_sums_key" in found
    assert any(use.startswith("costmodels.planted: costmodels.bounds._vector") for use in found)
    assert not any("core_sums" in use and "_core_sums" not in use for use in found)


def test_planner_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in (REPO / "planner").glob("*.py"))
    assert len(top) <= 6, top
    assert len(modules()) > 100  # the walk found the tree
