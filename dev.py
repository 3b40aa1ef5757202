#!/usr/bin/env python3
"""One entry point for people and CI: `python3 dev.py demo` and `python3 dev.py test`.

Needs nothing but Python 3.11: it creates `.venv` in the repository on first use, installs the
project at the versions of constraints.txt (re-installed when it or pyproject.toml changes), builds the
real-model fixtures and then runs. The fixtures (5 GB of models and their conversions) live in the cache
outside the repository, each rebuilt only when its builder or the converter's version changes, so a
clean clone reuses them; `.fixtures` in the repository links there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".convgate-installed"
# exact versions (pyproject.toml has the bounds): a clean clone must resolve what the cached fixtures were
# built with, or their keys (transformers', llama-cpp-python's versions) change and every one is rebuilt
CONSTRAINTS = ROOT / "constraints.txt"
TORCH = "torch==2.13.0"
LLAMA_CPP = "llama-cpp-python==0.3.36"
# A portable CPU build: the default -march=native bakes in this host's AMX and AVX-512, which a VM may
# not let a process use (SIGILL in the Q8_0 matmul on these machines) and another CI host may lack.
LLAMA_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
CACHE = Path(os.environ.get("CONVGATE_CACHE", Path.home() / ".cache" / "convgate"))
FIXTURES = CACHE / "fixtures"


def _run(*args: str | Path, env: dict[str, str] | None = None) -> int:
    print("+", " ".join(str(a) for a in args), file=sys.stderr, flush=True)
    return subprocess.call([str(a) for a in args], cwd=ROOT, env=env)


def _check(*args: str | Path) -> None:
    if _run(*args):
        sys.exit(f"dev.py: command failed: {' '.join(str(a) for a in args)}")


def llama_wheel() -> Path:
    """llama-cpp-python built once per version and build flags into a wheel folder outside the repo.

    pip's own wheel cache keys a build by the sdist alone, not by CMAKE_ARGS, so this folder is the cache."""
    key = hashlib.sha256(f"{LLAMA_CPP} {LLAMA_CMAKE_ARGS}".encode()).hexdigest()[:12]
    folder = CACHE / "wheels" / f"{LLAMA_CPP.replace('==', '-')}-{key}"
    wheels = sorted(folder.glob("*.whl"))
    if wheels:
        return wheels[0]
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    print(f"dev.py: building {LLAMA_CPP} (portable CPU flags; 7-11 minutes on 2 cores, once)", file=sys.stderr)
    env = dict(os.environ, CMAKE_ARGS=LLAMA_CMAKE_ARGS, FORCE_CMAKE="1")
    if _run(PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", partial, LLAMA_CPP, env=env):
        sys.exit(f"dev.py: building {LLAMA_CPP} failed")
    partial.rename(folder)
    return sorted(folder.glob("*.whl"))[0]


def ensure_venv() -> None:
    """Create the virtual environment and install the project once per pyproject or build-flag change."""
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()
                            + LLAMA_CMAKE_ARGS.encode()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not PYTHON.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = (PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q")
    _check(*pip, "--upgrade", "pip")
    _check(*pip, "-c", CONSTRAINTS, TORCH)
    _check(*pip, "--force-reinstall", "--no-deps", llama_wheel())
    _check(*pip, "-c", CONSTRAINTS, "-e", f"{ROOT}[dev]")
    STAMP.write_text(wanted)


def _link_fixtures() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    link = ROOT / ".fixtures"
    if not link.exists() and not link.is_symlink():
        link.symlink_to(FIXTURES, target_is_directory=True)  # the scripts' default --fixtures


def build_fixtures(*names: str) -> None:
    _link_fixtures()
    _check(PYTHON, ROOT / "scripts" / "build_fixtures.py", "--out", FIXTURES, *names)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def demo() -> int:
    """The embedded default end to end: start the service (SQLite + local worker pool), submit a real
    verification of llama.cpp's Q8_0 conversion of all-MiniLM-L6-v2 through the API, wait, print the verdict."""
    import hashlib
    import time
    import urllib.request

    build_fixtures("minilm")
    home = ROOT / ".convgate"
    env = dict(os.environ, CONVGATE_DATABASE_URL=f"sqlite:///{home / 'convgate.db'}",
               CONVGATE_CACHE_DIR=str(home / "cache"), CONVGATE_FILE_ROOTS=json.dumps([str(FIXTURES)]))
    convgate = str(VENV / "bin" / "convgate")
    port = _free_port()
    subprocess.check_call([convgate, "db", "upgrade"], env=env)
    token = subprocess.check_output([convgate, "tokens", "create", f"demo-{int(time.time())}", "--role", "submitter"],
                                    env=env, text=True).strip()
    server = subprocess.Popen([convgate, "serve", "--port", str(port), "--no-migrate"], env=env, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        artifact = FIXTURES / "minilm" / "minilm-Q8_0.gguf"
        sha = hashlib.sha256(artifact.read_bytes()).hexdigest()
        print(f"service on {url} (SQLite at .convgate/, local worker pool); operator page: {url}/ui/queue",
              file=sys.stderr)
        client_env = dict(env, CONVGATE_URL=url, CONVGATE_TOKEN=token)
        submitted = subprocess.run(
            [convgate, "submit", (FIXTURES / "minilm" / "source").as_uri(), artifact.as_uri(), "--sha256", sha,
             "--texts", str(ROOT / "examples" / "english.txt"), "--wait"],
            env=client_env, stdout=subprocess.PIPE, text=True, check=False)
        verification_id = submitted.stdout.split()[0] if submitted.stdout else "?"
        report = ROOT / "reports" / f"demo-{verification_id}.md"
        report.parent.mkdir(exist_ok=True)
        report.write_text(subprocess.run([convgate, "report", verification_id], env=client_env, text=True,
                                         stdout=subprocess.PIPE, check=False).stdout)
        print(f"verification {verification_id}; report (with its model-card section): "
              f"{report.relative_to(ROOT)}", file=sys.stderr)
        print(submitted.stdout.strip().splitlines()[-1] if submitted.stdout.strip() else "NO VERDICT")
        return submitted.returncode
    finally:
        server.terminate()
        server.wait(timeout=30)


PG_TEST_ROLE = "convgate_test"
PG_TEST_PASSWORD = "convgate-test-only"  # a throwaway role on a loopback-only test server


def _apt_install(*packages: str) -> None:
    """Install Debian packages (CI and developer machines run as root with apt reachable)."""
    import shutil

    if not shutil.which("apt-get"):
        sys.exit(f"dev.py: {', '.join(packages)} missing and apt-get is not available to install it")
    _check("apt-get", "update", "-qq")
    _check("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages)


def _postgres_versions() -> list[str]:
    clusters = Path("/etc/postgresql")
    return sorted((p.name for p in clusters.iterdir() if (p / "main").is_dir()), key=int) if clusters.is_dir() else []


def ensure_postgres() -> str:
    """Install Debian's Postgres when missing, start its cluster, and make a password role for the tests.

    Debian's default pg_hba allows only peer auth on the socket and scram on TCP, so the suite gets its
    own CREATEDB CREATEROLE role (created over the socket as the postgres user) instead of editing pg_hba.
    Returns the admin URL the tests use (CONVGATE_TEST_PG)."""
    import shutil

    if not shutil.which("pg_ctlcluster") or not _postgres_versions():
        _apt_install("postgresql")
    versions = _postgres_versions()
    if not versions:
        major = sorted(p.name for p in Path("/usr/lib/postgresql").iterdir())[-1]
        _check("pg_createcluster", major, "main")
        versions = [major]
    version = versions[-1]
    _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start")
    sql = (f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PG_TEST_ROLE}') THEN "
           f"CREATE ROLE {PG_TEST_ROLE} LOGIN CREATEDB CREATEROLE PASSWORD '{PG_TEST_PASSWORD}'; END IF; END $$; "
           # the worker-privilege tests create the restricted worker roles they then try to abuse
           f"ALTER ROLE {PG_TEST_ROLE} CREATEROLE; "
           # a test database is dropped WITH (FORCE) even while a worker pod's session outlives its login
           f"GRANT pg_signal_backend TO {PG_TEST_ROLE};")
    _check("runuser", "-u", "postgres", "--", "psql", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql)
    return f"postgresql://{PG_TEST_ROLE}:{PG_TEST_PASSWORD}@127.0.0.1:5432/postgres"


def ensure_chromium() -> None:
    """The operator page is tested in Debian's headless Chromium; install it when missing."""
    import shutil

    if not shutil.which("chromium"):
        _apt_install("chromium")


def ensure_load_generator() -> None:
    """scripts/bench_api.py drives the API with wrk, a compiled client that never bounds the figures."""
    import shutil

    if not shutil.which("wrk"):
        _apt_install("wrk")


def ensure_container_tools() -> None:
    """The images are built with buildah on a debootstrap base, saved with skopeo and run under runc."""
    import shutil

    missing = [tool for tool in ("buildah", "skopeo", "runc", "debootstrap") if not shutil.which(tool)]
    if missing:
        _apt_install(*missing)


def test(pytest_args: list[str]) -> int:
    """Lint and type-check, build every fixture, run the whole suite."""
    _check(VENV / "bin" / "ruff", "check", "engine", "service", "edge", "fuzz", "tests", "scripts", "migrations",
           "dev.py")
    _check(VENV / "bin" / "mypy", "engine", "service", "edge")
    pg_admin = os.environ.get("CONVGATE_TEST_PG") or ensure_postgres()
    ensure_chromium()
    ensure_load_generator()
    ensure_container_tools()
    kube = (PYTHON, ROOT / "scripts" / "build_kube.py")  # cached by version; cold ~15 min on 2 cores
    images = (PYTHON, ROOT / "scripts" / "build_images.py", "--llama-wheels", llama_wheel().parent,
              "--torch-index", "https://pypi.org/simple")  # the api and worker images, cached by content
    env = dict(os.environ, CONVGATE_FIXTURES=str(FIXTURES), CONVGATE_TEST_PG=pg_admin,
               CONVGATE_STRICT_SKIPS="1")
    if pytest_args:  # the tests a developer named, as they named them
        build_fixtures()
        _check(*kube)
        _check(*images)
        return _run(PYTHON, "-m", "pytest", *pytest_args, env=env)
    return _run_halves(env, builds_beside=(kube, images))


# Where each test file runs. The main half builds the fixtures, then runs everything not named below; the
# beside half runs the cluster's binary and image builds, then the tests that need them. The files in SHARED
# (long, self-contained, measured from each run's JUnit XML, longest first) go one pytest each to whichever
# half is free first: on a warm machine that keeps the halves near equal, on a cold one the main half takes
# them while the builds still run, instead of both waiting on the builds (docs/development.md#the-suite).
NEEDS_BUILDS = ("tests/cluster", "tests/deploy")
SHARED = ("tests/integration/test_trained_models.py", "tests/integration/test_trained_gemma3.py", "tests/mutation",
          "tests/service/test_soak.py",
          "tests/integration/test_pretokenizer_sweep.py", "tests/integration/test_architectures_decoders.py",
          "tests/integration/test_config_generations.py", "tests/integration/test_architectures_encoders.py",
          "tests/integration/test_benchmark_scripts.py")


def _relayed(name: str, command: tuple[str | Path, ...], env: dict[str, str]) -> int:
    """Run `command`, its output line by line prefixed `[name]`."""
    process = subprocess.Popen([str(part) for part in command], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace")
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(f"[{name}] {line}")
        sys.stdout.flush()
    return process.wait()


def _run_halves(env: dict[str, str], builds_beside: tuple[tuple[str | Path, ...], ...]) -> int:
    """Two lanes of pytest side by side. On a cold machine the cluster's binaries and the images build
    (mostly downloads, layer writes and single-threaded installs) while the fixtures build and the main half
    runs; the shared files fill whichever lane is idle. On a warm machine every build is a cache hit."""
    reports = CACHE / "last-run"  # each pytest's JUnit XML: every test's duration, for whoever makes the suite faster
    reports.mkdir(parents=True, exist_ok=True)
    common = (PYTHON, "-m", "pytest", "--durations=20")
    # one thread each for torch, OpenMP and llama.cpp (engine/resources.py): two halves each running 2-thread
    # pools on 2 cores spin against each other (a SmolLM2 verification twice at once: 189 s; at 1 thread: 52 s)
    env = {"CONVGATE_THREADS": "1", **env}
    fixtures = (PYTHON, ROOT / "scripts" / "build_fixtures.py", "--out", FIXTURES)
    _link_fixtures()
    fixtures_built = threading.Event()
    shared = list(SHARED)
    taking = threading.Lock()
    codes: dict[str, int] = {}

    def run_shared(lane: str) -> None:
        while True:
            with taking:
                if not shared:
                    return
                path = shared.pop(0)
            report = reports / (Path(path).stem + ".xml")
            codes[path] = _relayed(lane, (*common, f"--junitxml={report}", path), env)

    def main_half() -> None:
        codes["fixtures"] = _relayed("fixtures", fixtures, env)
        fixtures_built.set()
        if codes["fixtures"] == 0:
            ignored = (f"--ignore={folder}" for folder in (*NEEDS_BUILDS, *SHARED))
            codes["main"] = _relayed("main", (*common, f"--junitxml={reports / 'main.xml'}", *ignored), env)
            run_shared("main")

    def beside_half() -> None:
        for number, build in enumerate(builds_beside):
            if code := _relayed("build", build, env):
                codes[f"build {number}"] = code
                return
        fixtures_built.wait()
        if codes.get("fixtures") == 0:
            codes["beside"] = _relayed("beside", (*common, f"--junitxml={reports / 'beside.xml'}", *NEEDS_BUILDS),
                                       env)
            run_shared("beside")

    threads = [threading.Thread(target=main_half), threading.Thread(target=beside_half)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"dev.py: exit codes {codes}")
    if not {"fixtures", "main", "beside", *SHARED} <= set(codes):  # a build failed: some tests never ran
        return next((code for code in codes.values() if code), 1)
    return max(codes.values(), key=abs)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"demo", "test", "setup"}:
        print("usage: python3 dev.py demo | test [pytest args] | setup", file=sys.stderr)
        return 2
    ensure_venv()
    command = sys.argv[1]
    if command == "demo":
        return demo()
    if command == "test":
        return test(sys.argv[2:])
    build_fixtures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
