"""uberprof's bootstrap, imported by every Python process started under `uberprof run`.

It must cost nothing and break nothing: it arms the rank agent (which waits for `import torch`
and stays inert in processes that are not ranks), then hands over to the `sitecustomize` it
shadows, if there is one further down sys.path.
"""


def _arm_uberprof() -> None:
    import os
    import sys

    if not os.environ.get("UBERPROF_RUN_DIR"):
        return
    try:
        try:
            import uberprof  # noqa: F401
        except ImportError:
            # A different interpreter than the one uberprof is installed in: use our copy.
            home = os.environ.get("UBERPROF_HOME")
            if not home:
                return
            _import_only_uberprof_from(home)
        from uberprof.collect.rank import activation

        if activation.configure_from_env():
            activation.install_when_torch_imported()
    except Exception as exc:  # noqa: BLE001 - never break the user's interpreter
        sys.stderr.write(f"uberprof: bootstrap failed ({type(exc).__name__}: {exc}); "
                         "this process is not profiled\n")


def _import_only_uberprof_from(home: str) -> None:
    """Import the `uberprof` package found in `home` without putting `home` on sys.path: the
    job must not be able to import what lies beside uberprof (its tests, samples, or every
    neighbour in site-packages) when it could not without uberprof."""
    import importlib.util
    import os
    import sys

    package = os.path.join(home, "uberprof")
    spec = importlib.util.spec_from_file_location(
        "uberprof", os.path.join(package, "__init__.py"), submodule_search_locations=[package])
    if spec is None or spec.loader is None:
        raise ImportError(f"no uberprof package in {home}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["uberprof"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["uberprof"]
        raise


def _chain_shadowed_sitecustomize() -> None:
    import importlib
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["uberprof_bootstrap_sitecustomize"] = mine
            sys.modules.setdefault("sitecustomize", mine)


_arm_uberprof()
_chain_shadowed_sitecustomize()
