"""Child side of roll_ma's Python tool: lock this interpreter down, then run the program.

Started by path as ``python -I -u _sandbox_boot.py SCRATCH PROGRAM ISOLATE_NET`` with the resource
limits already set by the parent (``python_tool.py`` says what is and is not protected). It imports
the standard library only. Steps:

1. ``ISOLATE_NET=1``: move into a new, empty network namespace (``unshare``; as root directly, else
   inside a new user namespace that maps our own uid). Where the kernel refuses, go on: step 2
   still refuses sockets inside Python.
2. An audit hook (PEP 578; it cannot be removed) that refuses: sockets and imports of the socket and
   ssl modules; new processes and signals to others; ctypes loading or calling native code; writes
   outside SCRATCH and reads outside SCRATCH and the Python installation (its prefixes); hard and
   symbolic links; walking the garbage collector (a way to reach the hook's settings).
3. Run PROGRAM as ``__main__`` with SCRATCH as the working directory and first import path.

The hook uses closure variables only (never module globals or builtins looked up at call time), so
a program that reaches its frame through a traceback cannot rewire it by editing globals.
"""

import os
import sys


def _isolate_network() -> bool:
    """True when this process now lives in an empty network namespace (no route anywhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        clone_newuser, clone_newnet = 0x10000000, 0x40000000
        if os.geteuid() == 0:
            return libc.unshare(clone_newnet) == 0
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(clone_newuser | clone_newnet) != 0:
            return False
        # why: map our own ids into the new user namespace, so scratch files keep their owner
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return True
    except Exception:  # noqa: BLE001 - best effort; the audit hook still refuses sockets
        return False


# audit events refused outright, and those whose path arguments are checked (writes / reads); the hook
# binds them locally, so the sandboxed program cannot swap them
_BLOCKED_IMPORTS = frozenset({"socket", "_socket", "ssl", "_ssl"})
_BLOCKED_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.spawn",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "os.link",
        "os.symlink",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys.remote_exec",
    }
)
_PATH_EVENTS = frozenset(
    {
        "os.remove",
        "os.rename",
        "sqlite3.connect",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.utime",
        "os.chflags",
        "os.lchflags",
        "os.setxattr",
        "os.removexattr",
        "shutil.rmtree",
        "shutil.move",
        "shutil.copyfile",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.copytree",
        "shutil.chown",
        "shutil.make_archive",
        "shutil.unpack_archive",
    }
)
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "glob.glob", "os.getxattr", "os.listxattr"})
_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def _make_hook(scratch: str, read_roots: tuple):
    import os.path

    realpath, fsdecode, fspath, sep = os.path.realpath, os.fsdecode, os.fspath, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _isinstance, _str, _bytes, _int, _any = isinstance, str, bytes, int, any
    _PermissionError, _ImportError = PermissionError, ImportError
    blocked_imports, blocked_events = _BLOCKED_IMPORTS, _BLOCKED_EVENTS
    path_events, read_events, devices = _PATH_EVENTS, _READ_EVENTS, _DEVICES

    def _resolve(path):
        if _isinstance(path, _int) or path is None:
            return None
        try:
            path = fspath(path)
        except TypeError:
            return None
        if _isinstance(path, _bytes):
            path = fsdecode(path)
        return realpath(path) if _isinstance(path, _str) else None

    def _inside(path, roots):
        return _any(path == root or path.startswith(root + sep) for root in roots)

    def _check(path, write):
        resolved = _resolve(path)
        if resolved is None or resolved in devices:
            return
        if _inside(resolved, (scratch,)) or (not write and _inside(resolved, read_roots)):
            return
        raise _PermissionError(
            f"{'writing' if write else 'reading'} {resolved} is not allowed: the python tool may only "
            f"use its scratch directory ({scratch}) and read the Python installation"
        )

    def hook(event, args):
        if event == "import":
            if args[0] in blocked_imports:
                raise _ImportError(f"import of {args[0]} is blocked: the python tool has no network access")
        elif event == "open":
            path, mode, flags = args
            if _isinstance(mode, _str):
                write = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            else:
                write = _isinstance(flags, _int) and (flags & write_flags) != 0
            _check(path, write)
        elif event.startswith("socket."):
            raise _PermissionError(f"{event} is blocked: the python tool has no network access")
        elif event.startswith("ctypes."):
            raise _PermissionError(f"{event} is blocked: the python tool may not call native code")
        elif event in blocked_events:
            raise _PermissionError(f"{event} is blocked in the python tool")
        elif event in path_events:
            for arg in args:
                if _isinstance(arg, (_str, _bytes)):
                    _check(arg, True)
        elif event in read_events:
            _check(args[0] if args and args[0] is not None else ".", False)

    return hook


def main() -> None:
    scratch, program, isolate_net = os.path.realpath(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    boot_file = os.path.realpath(__file__)
    if isolate_net:
        _isolate_network()
    # why import ctypes now: `import ctypes` itself opens the interpreter with dlopen, which the hook refuses
    # afterwards, and sympy imports ctypes
    import ctypes  # noqa: F401
    import traceback

    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    read_roots = tuple(sorted({os.path.realpath(p) for p in prefixes if p}))
    with open(program, encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "main.py", "exec")
    os.chdir(scratch)
    sys.path.insert(0, scratch)
    sys.argv = ["main.py"]
    sys.addaudithook(_make_hook(scratch, read_roots))
    namespace = {
        "__name__": "__main__",
        "__file__": os.path.join(scratch, "main.py"),
        "__builtins__": __builtins__,
    }
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - report the program's error like python would
        # why drop this file's frames: the agent should read its program's traceback, not the sandbox's
        frames = [
            f for f in traceback.extract_tb(err.__traceback__) if os.path.realpath(f.filename) != boot_file
        ]
        text = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
        sys.stderr.write("".join(text + traceback.format_exception_only(type(err), err)))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
