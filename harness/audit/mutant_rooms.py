"""What the mutation run draws from: every file of the patches (`fastpath/`, its GPU code included) and the code of
the harness that decides (a check's rule, a verdict, a statistic that feeds one, the search of the bisect), room by
room, each room with the tests its mutants meet.

A harness room's mutants meet only that room's own tests, the fast pure-Python ones: mutmut's stats run still picks,
of those, the tests that call the mutated function. In a harness file only the functions named here are mutated;
the rest of it renders pages, prints, or runs processes, and a changed word of a message is not a changed verdict.
Names are mutmut's: `function`, or `Class.method` (a nested function is part of the function it is in).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# docs/commands.md against every parser's --help: the command lines' options, defaults and help texts
REFERENCE = "tests_harness/test_cli.py::test_the_command_reference_is_what_every_parser_prints"
# the tests that apply the patches (the default run's, without --slow), the golden outputs, and the reference of
# the package's own command line
PATCH_TESTS = ("tests_patches", "tests_parity", "tests_speed", "tests_harness/test_goldens.py", REFERENCE)
ALL = None  # every function of the file


@dataclass(frozen=True)
class Room:
    name: str
    files: dict  # path -> the functions that decide (a tuple of mutmut's names), or ALL
    tests: tuple  # the test folders, files or node ids its mutants meet
    # node ids of those that are not fast and pure-Python (a pytest child, a venv, a clone), or that read the source
    leave_out: tuple = ()


def functions(text: str) -> tuple:
    return tuple(text.split())


FASTPATH = ("fastpath/__init__.py", "fastpath/__main__.py", "fastpath/device_defaults.py",
            "fastpath/fingerprints.py", "fastpath/instance.py", "fastpath/loop.py", "fastpath/prompt_cache.py",
            "fastpath/registry.py", "fastpath/streaming.py")
GPU = ("fastpath/gpu/__init__.py", "fastpath/gpu/compiled.py", "fastpath/gpu/flags.py", "fastpath/gpu/graphs.py",
       "fastpath/gpu/packed.py", "fastpath/gpu/padding.py", "fastpath/gpu/shapes.py")
H, Q, S = "tests_harness/", "tests_quality/", "tests_speed/"

# in the patches' tests: one that needs this checkout's git history (a mutant's work folder is a copy of its files),
# and the guard's strangers, whose planted leak sets OMP_NUM_THREADS=1, which every mutant's run has already set (the
# guard is the audit room's, with its own tests)
PATCH_LEAVE_OUT = (S + "test_bisect.py::test_each_probe_counts_its_own_commits_fastpath",
                   "tests_patches/test_shared_state.py::test_each_leak_a_stranger_writes_fails_its_own_test")

ROOMS = (
    Room("patches", dict.fromkeys(FASTPATH, ALL), PATCH_TESTS, PATCH_LEAVE_OUT),
    # the GPU code's CPU doubles live in tests_patches (fake_cuda.py, test_gpu_*.py): the patches' tests
    Room("gpu", dict.fromkeys(GPU, ALL), PATCH_TESTS, PATCH_LEAVE_OUT),
    Room("gate", {
        "harness/gate/gate.py": functions(
            "Check.__post_init__ rule_fingerprints rule_goldens rule_behaviour rule_parity rule_api rule_work "
            "rule_rtf rule_quality rule_cuda_rows unhealthy work_lost public_api verdict parse_junit merge_runs "
            "fingerprint_rows check_parity check_behaviour real_checkpoint check_quality check_quality_set run_gate "
            "could_not_run _checks _quality_metrics main"),
        "harness/gate/behaviour.py": functions(
            "compare compare_setting field_difference first_difference bits same_number raised cannot_run where"),
        "harness/gate/goldens.py": functions(
            "_summary_difference compare_point compare match_versions matching exact_keys merge_goldens"),
        "harness/gate/versions.py": functions(
            "declared_requirement fingerprinted_versions golden_versions verified_versions range_for admitted"),
        "harness/gate/candidate.py": functions(
            "CandidateError.__init__ unreachable installs_package provider package_folder git_spec parse_spec "
            "Env.import_check _pip _reusable remote_commit"),
    }, (H + "test_gate.py", H + "test_gate_rules.py", H + "test_gate_exits.py", H + "test_gate_cuda.py", H + "test_gate_sources.py",
        H + "test_behaviour_errors.py", H + "test_behaviour.py", H + "test_goldens.py",
        "tests_patches/test_omnivoice_range.py", REFERENCE),
        (H + "test_gate.py::test_the_gates_parity_invocation_passes_the_refusal_tests_on_the_installed_version",
         H + "test_gate.py::test_a_folder_whose_dist_info_installs_omnivoice_under_another_name_is_that_candidate",
         H + "test_gate_exits.py::test_an_index_that_cannot_be_reached_is_the_gates_side_and_a_missing_version_the_"
             "candidates",
         H + "test_gate_cuda.py::test_the_cuda_rows_are_the_gpu_parity_tests_and_the_two_runs_cover_the_tier_once",
         H + "test_gate_cuda.py::test_here_without_cuda_the_gate_says_it_cannot_run_the_cuda_rows")),
    Room("speed", {
        "harness/speed/compare.py": functions(
            "min_p_value min_samples_for_alpha check_reachable one_sided_p compare_point compare_speed_runs "
            "mark_unstable should_remeasure judge_points gate_on_baseline slowdown_fraction probability stored_for "
            "main"),
        "harness/speed/floors.py": functions("ratio_floor floor_size remeasured_once gated_ratio"),
        "harness/speed/stability.py": functions("ratio_spread judge judge_rounds sample_spread"),
    }, (S + "test_compare.py", S + "test_floors.py", H + "test_stability.py",
        S + "test_stream.py::test_a_device_that_keeps_up_saves_zero_underruns_and_is_gated_by_the_slack",
        H + "test_report.py::test_a_timing_with_too_few_rounds_is_unjudged_not_unstable", REFERENCE)),
    Room("quality", {
        "harness/quality/stats.py": functions(
            "margin_fraction paired_arrays block_sums linearised_se studentized_bounds seeds_per_block "
            "equivalent_se seeds_needed gate score_gate"),
        "harness/quality/evaluate.py": functions("decide compare_sets bad_audio"),
        "harness/quality/audio.py": functions("judge_samples _judges check_clip check_clips refuse require "
                                              "check_duration"),
        "harness/quality/sets.py": functions("detect_format _seed_tts librispeech_root _librispeech_pc check_items "
                                             "read_set combined"),
    }, (Q + "test_stats.py", Q + "test_evaluate.py", Q + "test_sets.py",
        Q + "test_sim_mos.py::test_the_score_gate_is_one_sided_in_the_right_direction",
        Q + "test_sim_mos.py::test_a_small_noisy_run_is_underpowered_naming_the_seeds_it_needs",
        Q + "test_sim_mos.py::test_the_score_gate_refuses_unpaired_scores_and_a_bad_margin",
        Q + "test_sim_mos.py::test_one_verdict_passes_only_when_every_metric_passes",
        Q + "test_clone_sets.py::test_a_comparison_needs_a_judge",
        Q + "test_audio.py::test_the_floor_is_counted_at_the_judges_rate",
        Q + "test_audio.py::test_check_clip_names_an_unknown_judge"),
        # reads the source: in mutmut's copy each mutant of gate_on_holdout is a function that reads the holdout
        (Q + "test_evaluate.py::test_only_the_gate_reads_the_holdout",)),
    Room("nightly", {
        "harness/nightly/changes.py": functions(
            "predictive within_night_sigma check_alpha Rule.__post_init__ locate first_changed scan moves exact_kind "
            "exact_counts scan_exact rule_for unjudged busy_nights seen_through is_statistical check_history"),
        "harness/nightly/history.py": functions("check accept check_limit Night.median History.series load_history "
                                                "check_night append split_key"),
        "harness/nightly/bisect.py": functions("bisect floor_of commit_range main"),
    }, (S + "test_changes.py", S + "test_history.py", S + "test_bisect.py",
        S + "test_dashboard.py::test_a_changed_mix_of_exact_counts_is_shown_as_a_failure_and_can_be_accepted",
        REFERENCE),
        (S + "test_bisect.py::test_each_probe_counts_its_own_commits_fastpath",
         S + "test_bisect.py::test_count_with_this_drives_each_commits_patches_with_this_harness")),
    Room("counts", {
        "harness/counts/instructions.py": functions(
            "ratios is_count is_whole is_ratio is_margin spread check_stored load_runs machine_kind check record "
            "report"),
    }, (S + "test_counts.py",)),
    Room("run", {
        "harness/run/strict.py": functions("strict_default is_strict outcome missing not_judged not_applicable "
                                           "refused_by_design"),
    }, (H + "test_installed.py", S + "test_counts.py", S + "test_compare.py", "tests_patches/test_layouts.py")),
    Room("audit", {
        "harness/audit/shared_state.py": functions(
            "changed differences entry_differences settings_changed environ_changed foreign model_changed unchanged "
            "same same_tensor torch_equal tensors_moved dynamo_globals dynamo_wrapper inherited fastpaths_own_entry "
            "upstreams_record upstreams_own defined_in_fastpath installed reach containers environment "
            "shared_models model_state"),
        "harness/audit/controls.py": functions("table row_of skip_is_a_failure"),
    }, ("tests_patches/test_shared_state.py", H + "test_controls.py"),
        # each of these starts a child pytest of a minute (the guard's and the controls' end-to-end known answers)
        ("tests_patches/test_shared_state.py::test_a_class_level_enable_with_an_instance_only_revert_fails_the_run",
         "tests_patches/test_shared_state.py::test_each_leak_a_stranger_writes_fails_its_own_test",
         H + "test_controls.py::test_a_listed_control_that_skips_where_it_runs_fails_the_run",
         H + "test_controls.py::test_a_patch_that_refuses_this_machine_by_design_makes_its_controls_not_applicable",
         H + "test_controls.py::test_every_listed_control_exists_and_runs_where_the_table_says",
         H + "test_controls.py::test_the_ci_stage_runs_exactly_the_tables_ci_rows")),
)


def rooms(names=None) -> list:
    """The rooms named (all of them by default), in ROOMS' order; an unknown name is an error naming the known."""
    known = {room.name: room for room in ROOMS}
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"no mutant room {unknown}; the rooms are {', '.join(known)}")
    return [room for room in ROOMS if not names or room.name in names]


def room_of(path: str) -> Room:
    for room in ROOMS:
        if path in room.files:
            return room
    raise ValueError(f"{path} is in no mutant room (harness.audit.mutant_rooms.ROOMS)")


def files(chosen) -> list:
    return [path for room in chosen for path in room.files]


def decides(path: str, function: str) -> bool:
    """Whether a mutant of `function` in `path` is in the scope: every function of a file listed as ALL, else the
    listed ones."""
    listed = room_of(path).files[path]
    return listed is ALL or function in listed


def selection(room: Room) -> tuple:
    """The pytest arguments of a room's tests: its tests, and each left-out one deselected."""
    return room.tests + tuple(f"--deselect={node}" for node in room.leave_out)


def module_name(path: str) -> str:
    """fastpath/gpu/graphs.py -> fastpath.gpu.graphs; a package's __init__.py -> the package."""
    parts = path[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(text: str, module: str) -> bool:
    """Whether Python source `text` imports `module` (or a module inside it) by name: `import a.b`, `from a.b import
    x`, or `from a import b`."""
    package, _, leaf = module.rpartition(".")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(name == module or name.startswith(module + ".") for name in named):
            return True
    return False


def own_tests(room: Room, paths: list, root: Path) -> tuple:
    """The pytest arguments of the tests of `room` that import one of `paths` by name: a change's first, narrow run
    (`audit mutants --changed-since`). Each folder of the room's tests is read file by file; a node id stays where
    its file imports one; the left-out ones stay deselected. The room's whole selection where no test file imports
    one (a survivor of the narrow run is run again on the whole selection: mutants.widen)."""
    names = [module_name(p) for p in paths]
    kept = []
    for test in room.tests:
        target = root / test.split("::")[0]
        candidates = sorted(target.glob("test_*.py")) if target.is_dir() else [target]
        for file in candidates:
            if file.is_file() and any(imports(file.read_text(), name) for name in names):
                kept.append(test if "::" in test else str(file.relative_to(root)))
    kept = list(dict.fromkeys(kept))
    if not kept:
        return selection(room)
    return tuple(kept) + tuple(f"--deselect={node}" for node in room.leave_out if node.split("::")[0] in
                               {k.split("::")[0] for k in kept})
