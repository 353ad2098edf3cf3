"""Compile the C sources into one cffi extension in a per-user cache, and load it safely.

**API mode, compiled by us.** cffi writes the CPython wrapper (`cffi.FFI.emit_c_code`); the
system compiler builds it and every ``csrc/<family>_<level>.c`` with that level's ``-m`` flags
(per-file flags: no AVX-512 instruction can reach a portable object), and links one shared object
with ``-fopenmp`` (so it binds to the libgomp torch loaded: one thread pool). Measured on the
project machine: an API-mode call with two buffer pointers costs ~1.1 us against ~2.0 us through
ABI mode (libffi); ABI mode would spare the Python headers, nothing else. Driving the compiler
directly (not setuptools) gives per-file flags, parallel compiles and the compiler's full output.

**Cache.** ``$REFCORE_CACHE_DIR`` or ``$XDG_CACHE_HOME/refcore`` or ``~/.cache/refcore``, then
``native/``, both owner-only (0700)::

    native-<key>.so     the extension module, replaced atomically (os.replace) once built
    native-<key>.json   manifest: key and SHA-256 of the .so (a mismatch means corrupt: rebuild)
    native-<key>.log    every compiler command and its output, for the last build
    native-<key>.lock   flock'd while a process builds; others wait, then load its result
    tmp-*/              private build directories, removed after each build

``key`` hashes everything the binary depends on: sources and headers, the cffi declarations,
compiler command and ``--version``, flags, Python ABI, cffi version, machine. A changed source
gives a new key (a stale entry is never loaded); a corrupt entry fails its hash and is rebuilt.

**Sanitized build.** ``REFCORE_NATIVE_SANITIZE=1`` compiles every file with AddressSanitizer and
UndefinedBehaviorSanitizer (`SANITIZE_FLAGS`: an out-of-bounds access or undefined behaviour
aborts the process with a report) into an entry of its own (the flags are in the key, so a
sanitized library never loads in a normal run, nor the reverse). Python is not built with ASan,
so its runtime must be preloaded (`sanitizer_env` gives the environment; ``python -m refcore
sanitize`` runs the native tests under it); loading without it raises `BuildError` saying what to
set, where the ASan runtime itself would abort the process.

**Safety.** A library is loaded only from a directory owned by this user and writable by no one
else, below ancestors that only this user or root can modify (sticky directories such as /tmp
excepted), and only if the file is a regular file owned by this user matching its manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

#: bump when the build recipe below changes in a way the key does not see
RECIPE = 1
ENV_CACHE = "REFCORE_CACHE_DIR"
CSRC = Path(__file__).with_name("csrc")
#: op families: one header ``csrc/<family>.h`` each (also its cffi declarations), beside the
#: ``rc_*.h`` helpers shared by every file. Adding a family is adding its header and C files.
FAMILIES = tuple(sorted(p.stem for p in CSRC.glob("*.h") if not p.stem.startswith("rc_")))
#: ISA level -> compiler flags for that level's files (levels as in refcore.cpu.LEVELS)
_AVX512 = ("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
_AVX512_BF16 = (*_AVX512, "-mavx512bf16", "-mavx512vnni")
LEVEL_FLAGS: dict[str, tuple[str, ...]] = {
    "portable": (),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "avx512": _AVX512,
    "avx512_bf16": _AVX512_BF16,
    # AMX code runs only where refcore.cpu reports the OS granted tile data (arch_prctl).
    "amx": (*_AVX512_BF16, "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
}
KERNEL_FLAGS = (
    "-std=gnu11",
    "-O3",
    "-fPIC",
    "-fopenmp",
    "-fno-math-errno",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
)
WRAPPER_FLAGS = ("-O2", "-fPIC", "-fno-strict-aliasing", "-DNDEBUG")
LINK_FLAGS = ("-shared", "-fopenmp")
ENV_SANITIZE = "REFCORE_NATIVE_SANITIZE"
#: added to every compile in a sanitized build (their -O1 replaces -O3 / -O2: ASan's advice for
#: usable reports); the link gets the first one, which pulls in the two runtimes
SANITIZE_FLAGS = (
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g",
    "-O1",
)
#: ASan runtime options for a Python process: CPython and numpy keep memory until exit (leak
#: reports would be noise); torch probes allocations too large to serve (a null, not an abort)
ASAN_OPTIONS = "detect_leaks=0:allocator_may_return_null=1:abort_on_error=0:symbolize=1"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"
LOCK_TIMEOUT = 900.0  # seconds to wait for another process's build


class BuildError(RuntimeError):
    """The library cannot be built or loaded here; ``log_path`` holds the compiler output."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What to compile, how, and the key that names the result."""

    cc: tuple[str, ...]
    cc_version: str
    sources: tuple[tuple[str, Path], ...]  # (ISA level, C file)
    cdef: str
    key: str
    sanitize: bool = False

    @property
    def module(self) -> str:
        return f"_refcore_native_{self.key}"


@dataclasses.dataclass(frozen=True)
class Library:
    """The loaded extension: ``lib`` (the C functions), ``ffi``, where it lives, how it came."""

    lib: object
    ffi: object
    path: Path
    how: str  # "cached" or "built in 3.1 s"


# ---------------------------------------------------------------------------------------------
# what to build


def levels_here() -> tuple[str, ...]:
    """ISA levels whose files compile on this platform (x86-64 has them all)."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return tuple(LEVEL_FLAGS)
    return ("portable",)


def _level_of(function: str) -> str | None:
    for lvl in sorted(LEVEL_FLAGS, key=len, reverse=True):
        if function.endswith("_" + lvl):
            return lvl
    return None


def cdef_for(levels: tuple[str, ...]) -> str:
    """The prototypes of ``csrc/<family>.h`` for ``levels`` (the headers are the declarations)."""
    decls = []
    for fam in FAMILIES:
        text = re.sub(r"/\*.*?\*/", "", (CSRC / f"{fam}.h").read_text(), flags=re.S)
        text = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        for stmt in text.split(";"):
            m = re.search(r"\b(rc_\w+)\s*\(", stmt)
            if m and _level_of(m.group(1)) in levels:
                decls.append(" ".join(stmt.split()) + ";")
    return "\n".join(decls)


def compiler() -> tuple[tuple[str, ...], str]:
    """The C compiler command (``$CC``, else cc / gcc / clang on PATH) and its version line."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        argv = tuple(shlex.split(cc))
        if shutil.which(argv[0]) is None:
            raise BuildError(f"no C compiler: CC={cc!r} is not an executable on PATH")
    else:
        found = next((n for n in ("cc", "gcc", "clang") if shutil.which(n)), None)
        if found is None:
            raise BuildError("no C compiler: none of cc, gcc, clang is on PATH (or set CC)")
        argv = (found,)
    try:
        res = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, timeout=60, env=_tool_env()
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"C compiler {' '.join(argv)!r} does not run: {e}") from e
    if res.returncode != 0:
        out = (res.stdout + res.stderr).strip()
        raise BuildError(f"C compiler {' '.join(argv)!r} --version failed: {out[:300]}")
    return argv, (res.stdout.strip().splitlines() or ["unknown version"])[0]


def sanitizing() -> bool:
    """Whether ``REFCORE_NATIVE_SANITIZE`` asks for the sanitized build (set, not ``0``)."""
    return os.environ.get(ENV_SANITIZE, "").strip() not in ("", "0")


def _sanitized(flags: tuple[str, ...], sanitize: bool) -> tuple[str, ...]:
    """``flags`` with the sanitizer flags in place of the optimisation level, when ``sanitize``."""
    if not sanitize:
        return flags
    return (*(f for f in flags if not f.startswith("-O")), *SANITIZE_FLAGS)


def kernel_flags(sanitize: bool) -> tuple[str, ...]:
    return _sanitized(KERNEL_FLAGS, sanitize)


def wrapper_flags(sanitize: bool) -> tuple[str, ...]:
    return _sanitized(WRAPPER_FLAGS, sanitize)


def link_flags(sanitize: bool) -> tuple[str, ...]:
    return (*LINK_FLAGS, SANITIZE_FLAGS[0]) if sanitize else LINK_FLAGS


@functools.cache
def recipe() -> Recipe:
    """The build recipe for this platform and compiler (computed once per process)."""
    import cffi

    cc, version = compiler()
    levels = levels_here()
    sources = tuple(
        (lvl, CSRC / f"{fam}_{lvl}.c")
        for fam in FAMILIES
        for lvl in levels
        if (CSRC / f"{fam}_{lvl}.c").exists()
    )
    cdef = cdef_for(levels)
    sanitize = sanitizing()
    h = hashlib.sha256()
    for part in (
        str(RECIPE),
        "sanitize" if sanitize else "release",
        cffi.__version__,
        sys.implementation.cache_tag,
        str(sysconfig.get_config_var("EXT_SUFFIX")),
        platform.machine(),
        " ".join(cc),
        version,
        repr(LEVEL_FLAGS),
        repr(kernel_flags(sanitize)),
        repr(wrapper_flags(sanitize)),
        repr(link_flags(sanitize)),
        cdef,
    ):
        h.update(part.encode() + b"\0")
    for f in sorted(CSRC.iterdir()):
        if f.suffix in (".c", ".h"):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return Recipe(cc, version, sources, cdef, h.hexdigest()[:20], sanitize)


# ---------------------------------------------------------------------------------------------
# the sanitizer runtimes

_RUNTIMES = ("libasan.so", "libubsan.so")


def _tool_env() -> dict[str, str]:
    """The environment for the compiler: ours without preloaded sanitizer runtimes (a sanitized
    test run preloads them; gcc itself is not built for them)."""
    env = dict(os.environ)
    keep = [p for p in env.get("LD_PRELOAD", "").split() if not _is_runtime(p)]
    if keep:
        env["LD_PRELOAD"] = " ".join(keep)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def _is_runtime(path: str) -> bool:
    return Path(path).name.startswith(("libasan.so", "libubsan.so"))


def sanitizer_runtimes() -> tuple[Path, ...]:
    """The compiler's ASan and UBSan runtime libraries (to preload); BuildError when it has none."""
    argv, _ = compiler()
    found = []
    for name in _RUNTIMES:
        try:
            res = subprocess.run(
                [*argv, f"-print-file-name={name}"],
                capture_output=True,
                text=True,
                timeout=60,
                env=_tool_env(),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(f"C compiler {' '.join(argv)!r} does not run: {e}") from e
        path = Path(res.stdout.strip())
        if res.returncode != 0 or not path.is_absolute() or not path.exists():
            raise BuildError(
                f"the C compiler {' '.join(argv)!r} has no {name} (the sanitizer runtime; on "
                "Debian / Ubuntu it comes with gcc's libasan / libubsan packages)"
            )
        found.append(path)
    return tuple(found)


def sanitizer_env() -> dict[str, str]:
    """The variables a Python process needs to load the sanitized library: ``LD_PRELOAD`` of the
    runtimes (before anything else the process loads), their options, ``REFCORE_NATIVE_SANITIZE``.

    Options already in the environment come after ours, so they win.
    """
    preload = [str(p) for p in sanitizer_runtimes()]
    preload += [p for p in os.environ.get("LD_PRELOAD", "").split() if not _is_runtime(p)]
    return {
        "LD_PRELOAD": " ".join(preload),
        "ASAN_OPTIONS": ":".join(filter(None, (ASAN_OPTIONS, os.environ.get("ASAN_OPTIONS")))),
        "UBSAN_OPTIONS": ":".join(filter(None, (UBSAN_OPTIONS, os.environ.get("UBSAN_OPTIONS")))),
        ENV_SANITIZE: "1",
    }


def _asan_loaded() -> bool:
    """Whether this process runs with the ASan runtime (preloaded: its entry point is global)."""
    import ctypes

    return hasattr(ctypes.CDLL(None), "__asan_init")


def _require_asan() -> None:
    """Raise the instructions to follow unless the ASan runtime is loaded (loading the sanitized
    library without it aborts the process: "ASan runtime does not come first")."""
    if _asan_loaded():
        return
    try:
        preload = " ".join(str(p) for p in sanitizer_runtimes())
    except BuildError as e:
        preload = f"<not found: {e}>"
    raise BuildError(
        f"{ENV_SANITIZE}=1 loads the native library built with AddressSanitizer, whose runtime "
        f"must be loaded before Python starts, and it is not: set LD_PRELOAD='{preload}' "
        f"ASAN_OPTIONS={ASAN_OPTIONS} UBSAN_OPTIONS={UBSAN_OPTIONS} in the environment of the "
        f"python command (`python -m refcore sanitize` does this and runs the native tests), or "
        f"unset {ENV_SANITIZE}"
    )


# ---------------------------------------------------------------------------------------------
# the cache directory


def cache_root() -> Path:
    """``$REFCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/refcore``, else ``~/.cache/refcore``."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "refcore"


def _private_dir(path: Path) -> Path:
    """Create ``path`` owner-only if missing; refuse it unless only this user can modify it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create cache directory {path}: {e}") from e
    real = Path(os.path.realpath(path))
    st = os.lstat(real)
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise BuildError(f"cache path {real} is not a directory")
    if st.st_uid != me:
        raise BuildError(
            f"cache directory {real} belongs to uid {st.st_uid}, not this user (uid {me}); "
            f"refusing to load code from it (set {ENV_CACHE} to a directory of your own)"
        )
    if st.st_mode & 0o022:
        raise BuildError(
            f"cache directory {real} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); refusing to load code from it (chmod 700 it, or "
            f"set {ENV_CACHE})"
        )
    if st.st_mode & 0o077:  # readable by others: tightening is always safe
        os.chmod(real, 0o700)
    for parent in real.parents:
        pst = os.stat(parent)
        if pst.st_uid not in (0, me):
            raise BuildError(
                f"cache directory {real} lies under {parent}, owned by uid {pst.st_uid}; "
                f"refusing to load code from it (set {ENV_CACHE})"
            )
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            raise BuildError(
                f"cache directory {real} lies under {parent}, writable by group or others "
                f"(mode {stat.S_IMODE(pst.st_mode):o}); refusing to load code from it "
                f"(set {ENV_CACHE})"
            )
    return real


def native_dir() -> Path:
    """The checked ``<cache root>/native`` directory (created 0700 when missing)."""
    _private_dir(cache_root())
    return _private_dir(cache_root() / "native")


@dataclasses.dataclass(frozen=True)
class Entry:
    """The files of one cache entry."""

    dir: Path
    key: str

    def path(self, suffix: str) -> Path:
        return self.dir / f"native-{self.key}{suffix}"

    @property
    def so(self) -> Path:
        return self.path(".so")

    @property
    def manifest(self) -> Path:
        return self.path(".json")

    @property
    def log(self) -> Path:
        return self.path(".log")

    @property
    def lock(self) -> Path:
        return self.path(".lock")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _valid(entry: Entry) -> bool:
    """The .so exists, is ours, and matches a manifest written for this key."""
    try:
        st = os.lstat(entry.so)
        man = json.loads(entry.manifest.read_text())
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return False
    return (
        isinstance(man, dict)
        and man.get("key") == entry.key
        and (man.get("sha256") == _sha256(entry.so))
    )


@contextlib.contextmanager
def _locked(path: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (another process building the same key waits)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"waited {timeout:.0f} s for another process building the native "
                        f"library (lock {path}); remove the lock file if no build is running"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


# ---------------------------------------------------------------------------------------------
# compile


def _python_include() -> Path:
    inc = Path(sysconfig.get_paths()["include"])
    if not (inc / "Python.h").exists():
        raise BuildError(
            f"Python.h not found in {inc}: the native provider compiles a CPython extension "
            "(cffi API mode); install the Python development headers (e.g. python3-dev)"
        )
    return inc


def _run_all(cmds: list[list[str]], log: list[str]) -> str | None:
    """Run compiler commands, ``os.cpu_count()`` at a time; log each; return the first failure."""
    failure = None
    width = max(1, os.cpu_count() or 1)
    env, PIPE = _tool_env(), subprocess.PIPE
    for i in range(0, len(cmds), width):
        procs = [
            (c, subprocess.Popen(c, stdout=PIPE, stderr=subprocess.STDOUT, text=True, env=env))
            for c in cmds[i : i + width]
        ]
        for cmd, p in procs:
            out, _ = p.communicate()
            log.append(f"$ {shlex.join(cmd)}\n{out}")
            if p.returncode != 0 and failure is None:
                errors = [ln for ln in out.splitlines() if "error" in ln.lower()]
                first = (errors or out.strip().splitlines() or ["(no output)"])[0]
                failure = f"{Path(cmd[0]).name} exited with status {p.returncode}: {first}"
    return failure


def _compile(r: Recipe, tmp: Path) -> tuple[Path, list[str], str | None]:
    """Build the extension in ``tmp``: its path, the log lines, and the first failure (or None)."""
    import cffi

    log = [f"refcore native build, key {r.key}\ncompiler: {shlex.join(r.cc)} ({r.cc_version})\n"]
    ffi = cffi.FFI()
    ffi.cdef(r.cdef)
    ffi.set_source(r.module, "".join(f'#include "{fam}.h"\n' for fam in FAMILIES))
    wrapper = tmp / f"{r.module}.c"
    with contextlib.redirect_stdout(io.StringIO()):  # cffi prints "generating <file>"
        ffi.emit_c_code(str(wrapper))
    inc = ["-I", str(CSRC)]
    objs, cmds = [], []
    for lvl, src in r.sources:
        obj = tmp / f"{src.stem}.o"
        objs.append(str(obj))
        kflags = kernel_flags(r.sanitize)
        cmds.append([*r.cc, *kflags, *LEVEL_FLAGS[lvl], *inc, "-c", str(src), "-o", str(obj)])
    objs.append(str(tmp / "wrapper.o"))
    cmds.append(
        [
            *r.cc,
            *wrapper_flags(r.sanitize),
            "-I",
            str(_python_include()),
            *inc,
            "-c",
            str(wrapper),
            "-o",
            objs[-1],
        ]
    )
    failure = _run_all(cmds, log)
    so = tmp / "native.so"
    if failure is None:
        failure = _run_all([[*r.cc, *link_flags(r.sanitize), *objs, "-o", str(so), "-lm"]], log)
    return so, log, failure


def _write_atomic(path: Path, text: str, tmp: Path) -> None:
    staged = tmp / (path.name + ".staged")
    staged.write_text(text)
    os.replace(staged, path)


def _build(r: Recipe, entry: Entry) -> float:
    """Compile into a private temp dir, then move the .so and its manifest into place."""
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=entry.dir))
    try:
        so, log, failure = _compile(r, tmp)
        _write_atomic(entry.log, "\n".join(log), tmp)
        if failure is not None:
            raise BuildError(
                f"native library build failed ({failure}); full compiler output in {entry.log}",
                entry.log,
            )
        seconds = time.monotonic() - t0
        manifest = {
            "key": r.key,
            "sha256": _sha256(so),
            "compiler": r.cc_version,
            "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(seconds, 2),
        }
        os.replace(so, entry.so)
        _write_atomic(entry.manifest, json.dumps(manifest, indent=1), tmp)
        return seconds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# load


def _import(entry: Entry, module: str) -> ModuleType:
    """Import the extension at ``entry.so`` under the name its init function carries."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(module, str(entry.so))
    spec = importlib.util.spec_from_file_location(module, entry.so, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _try_load(entry: Entry, module: str) -> tuple[ModuleType | None, str]:
    """The loaded module when the entry is valid and imports; else None and why not."""
    if not _valid(entry):
        return None, "missing, stale or corrupt"
    try:
        return _import(entry, module), ""
    except ImportError as e:
        return None, f"does not load: {e}"


def load(force: bool = False) -> Library:
    """Load the library from the cache, building it first when missing, corrupt, or ``force``."""
    r = recipe()
    if r.sanitize:
        _require_asan()
    entry = Entry(native_dir(), r.key)
    if not force:
        mod, _ = _try_load(entry, r.module)
        if mod is not None:
            return Library(mod.lib, mod.ffi, entry.so, "cached")
    with _locked(entry.lock):
        mod = None if force else _try_load(entry, r.module)[0]  # another process may have built it
        how = "cached (built by another process)"
        if mod is None:
            how = f"built in {_build(r, entry):.1f} s"
            mod, why = _try_load(entry, r.module)
            if mod is None:
                raise BuildError(f"the freshly built library {entry.so} {why}", entry.log)
    return Library(mod.lib, mod.ffi, entry.so, how)


#: serialises the first load: functools.cache alone lets threads that arrive together each run
#: `load` (each importing the extension, each possibly waiting on the build lock)
_LOAD_LOCK = threading.Lock()


@functools.cache
def _library_or_error() -> Library | BuildError:
    with _LOAD_LOCK:
        return _loaded()


@functools.cache
def _loaded() -> Library | BuildError:
    try:
        return load()
    except BuildError as e:
        return e


def library() -> Library:
    """The process's library (loaded once, also when threads ask at once; a failure is
    remembered and raised again)."""
    lib = _library_or_error()
    if isinstance(lib, BuildError):
        raise lib
    return lib
