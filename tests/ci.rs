//! The repository's own tooling: the failure summary `.ci/test` ends with, and what `.gitignore` covers.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `.ci/failures` on `log`: its exit code and stdout.
fn failures_of(log: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cargo-test.log");
    std::fs::write(&file, log).unwrap();
    let out = Command::new(Path::new(REPO).join(".ci/failures"))
        .arg(&file)
        .output()
        .expect(".ci/failures runs");
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_test_command_ends_with_every_failing_test_of_every_target_and_how_to_rerun_it() {
    let log = "\
     Running unittests src/lib.rs (target/debug/deps/tollgate-0a1b)
test store::tests::fine ... ok
test store::tests::broken ... FAILED
     Running tests/keys.rs (target/debug/deps/keys-2c3d)
test the_sqlite_file_never_holds_more_keys_than_max_keys ... FAILED
     Running tests/proxy.rs (target/debug/deps/proxy-4e5f)
test a_request_is_forwarded ... ok
error: 2 targets failed:
    `--lib`
    `--test keys`
";
    let (code, out) = failures_of(log);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("==== 2 failing tests ===="), "{out}");
    assert!(
        out.contains("cargo test --lib -- --exact store::tests::broken"),
        "{out}"
    );
    assert!(
        out.contains("tests/keys.rs")
            && out.contains(
                "cargo test --test keys -- --exact the_sqlite_file_never_holds_more_keys_than_max_keys"
            ),
        "{out}"
    );
    assert!(!out.contains("a_request_is_forwarded"), "{out}");

    let (code, out) = failures_of("     Running tests/proxy.rs (x)\ntest fine ... ok\n");
    assert_eq!((code, out.as_str()), (0, ""));
}

#[test]
fn the_quick_start_leaves_nothing_behind_that_git_would_add() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(Path::new(REPO).join("config.example.yaml")).unwrap();
    // The example's `store.path: tollgate.db`, relative to where it runs.
    let mut p = common::Process::serve(&example, dir.path());
    assert_eq!(common::http(p.addr, "GET", "/ping").unwrap().status, 200);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(15)).success());
    assert!(left.iter().any(|f| f == "tollgate.db"), "{left:?}");
    // The config and the log are this harness's, not the quick start's.
    let harness =
        |f: &str| f == "tollgate.yaml" || f.starts_with("tollgate-") && f.ends_with(".log");
    for file in left.iter().filter(|f| !harness(f)) {
        let ignored = Command::new("git")
            .args(["check-ignore", "--no-index", "-q", file])
            .current_dir(REPO)
            .status()
            .expect("git runs")
            .success();
        assert!(ignored, "{file} is left behind and not in .gitignore");
    }
}

/// Writes every config `bench/proxybench.py` and `bench/instructions.py`
/// start tollgate with into one directory each, through their own functions.
const WRITE_BENCH_CONFIGS: &str = r#"
import importlib.util, os, sys
sys.dont_write_bytecode = True  # nothing written into the checkout
repo, out = sys.argv[1], sys.argv[2]
def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(repo, "bench", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
def fresh(name):
    d = os.path.join(out, name)
    os.makedirs(d)
    return d
proxybench = load("proxybench")
d = fresh("proxybench")
proxybench.write_configs(d, also=True)
proxybench.write_access_log_configs(d)
instructions = load("instructions")
for store in ("sqlite", "memory"):
    instructions.write_configs(fresh("instructions-" + store), store, "true")
instructions.write_configs(fresh("instructions-challenge"), "sqlite", "true", challenge=True)
"#;

/// Both scripts once wrote `path:` for the memory store too, which tollgate
/// has refused since `store:` became one variant per backend: the memory
/// rows of `proxybench.py` and `instructions.py --store memory` no longer
/// started, and nothing in CI noticed.
#[test]
fn the_benchmark_scripts_start_tollgate_with_configs_it_accepts() {
    let out = tempfile::tempdir().unwrap();
    let wrote = Command::new("python3")
        .args(["-c", WRITE_BENCH_CONFIGS, REPO])
        .arg(out.path())
        .output()
        .expect("python3 runs");
    assert!(
        wrote.status.success(),
        "{}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    let mut checked = Vec::new();
    for dir in std::fs::read_dir(out.path()).unwrap() {
        for file in std::fs::read_dir(dir.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let check = Command::new(common::process::BINARY)
                    .args(["check", "--config"])
                    .arg(&path)
                    .output()
                    .unwrap();
                let said = String::from_utf8_lossy(&check.stderr).into_owned()
                    + &String::from_utf8_lossy(&check.stdout);
                assert!(check.status.success(), "{}: {said}", path.display());
                checked.push(path);
            }
        }
    }
    // proxybench: SQLite, memory and three access-log variants; instructions: three.
    assert!(checked.len() >= 8, "only {checked:?}");
}
