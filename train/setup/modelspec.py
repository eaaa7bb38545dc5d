"""MODEL=package.module:function, checked without importing the module (so before TensorFlow).

A user's module imports Keras, so importing it would load TensorFlow. Instead the module's source
is found on the Python path, parsed, and searched for the function: a module that cannot be
found, a syntax error, a missing function or a `def` that cannot be called as
`make_model(input_shape, num_classes)` stops the run in milliseconds (ConfigError, exit 2). What
only running the code can show (an exception inside it, what it returns, images too small for
it) is found when the model is built (train.models, ModelError, also exit 2).

Where the source cannot be judged statically (an extension module, `from x import *`, a module
`__getattr__`, decorators), the check says nothing and the build step reports what goes wrong.
"""

from __future__ import annotations

import ast
import importlib.util
import tokenize
from pathlib import Path

from ..errors import ConfigError

_DYNAMIC = object()  # a name bound in a way the source alone cannot tell
_DYNAMIC_CALLS = {"globals", "exec", "setattr", "vars", "__import__"}


def check_model_spec(spec: str) -> None:
    """ConfigError when `spec` (module:function) certainly cannot work; None when it may."""
    module, _, func = spec.partition(":")
    source = find_source(spec, module)
    if source is None:
        return
    try:
        with tokenize.open(source) as fh:  # honours a `# -*- coding: -*-` line, as import does
            text = fh.read()
        tree = ast.parse(text, filename=str(source))
    except SyntaxError as e:
        raise ConfigError("MODEL", spec, f"{source}, line {e.lineno}: SyntaxError: {e.msg}; fix the module") from None
    except (UnicodeDecodeError, OSError) as e:
        raise ConfigError("MODEL", spec, f"cannot read {source} ({type(e).__name__}: {e})") from None
    binding = _binding(tree, func)
    if binding is None:
        raise ConfigError("MODEL", spec, f"{source} defines no function {func!r}")
    if isinstance(binding, ast.Import):  # `import x as name` binds a module, never something to call
        raise ConfigError(
            "MODEL",
            spec,
            f"{func!r} in {source} (line {binding.lineno}) is an imported module, not a function: "
            "give MODEL=package.module:function",
        )
    if isinstance(binding, (ast.FunctionDef, ast.AsyncFunctionDef)) and not binding.decorator_list:
        problem = _signature_problem(binding.args)
        if problem:
            raise ConfigError(
                "MODEL",
                spec,
                f"{func}() in {source} (line {binding.lineno}) {problem}; a model "
                "factory is make_model(input_shape, num_classes)",
            )


def find_source(spec: str, module: str) -> Path | None:
    """The .py file of `module` (a package's __init__.py), None if it is not plain source."""
    top, *rest = module.split(".")
    if top == "__main__":  # a function of a notebook or a script: no module a run could import again
        raise ConfigError(
            "MODEL",
            spec,
            "a function defined in a notebook or script has no module to import it from: register it, "
            "train.models.register('NAME', function, 'what it is'), and set MODEL=NAME",
        )
    try:
        found = importlib.util.find_spec(top)  # a top-level name: finds it without running it
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(
            "MODEL",
            spec,
            f"cannot find module {top!r}: run from the folder that holds it, or add that folder to PYTHONPATH",
        )
    path = Path(found.origin) if found.origin and found.origin.endswith(".py") else None
    locations = list(found.submodule_search_locations or [])
    for i, part in enumerate(rest):
        if not locations:
            raise ConfigError(
                "MODEL", spec, f"{'.'.join([top, *rest[:i]])} is a module, not a package: it has no submodule {part!r}"
            )
        path, locations = _find_in(spec, ".".join([top, *rest[: i + 1]]), part, locations)
        if path is None and not locations:
            return None  # an extension or compiled module: judged when imported
    return path if path is not None and path.is_file() else None


def _find_in(spec: str, dotted: str, part: str, locations: list[str]) -> tuple[Path | None, list[str]]:
    """(source file, search locations if a package) of submodule `part` in the package's folders."""
    namespace: list[str] = []
    for folder in map(Path, locations):
        if (folder / part / "__init__.py").is_file():
            return folder / part / "__init__.py", [str(folder / part)]
        if (folder / f"{part}.py").is_file():
            return folder / f"{part}.py", []
        if (folder / part).is_dir():
            namespace.append(str(folder / part))
        elif any(folder.glob(f"{part}.*")):
            return None, []
    if namespace:
        return None, namespace
    raise ConfigError("MODEL", spec, f"cannot find module {dotted!r} in {', '.join(locations)}")


def _binding(tree: ast.Module, name: str):
    """The last top-level statement that binds `name`, _DYNAMIC if unknowable, None if none does."""
    found = None
    for node in _top_level(tree.body):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return _DYNAMIC
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__":
            return _DYNAMIC
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DYNAMIC_CALLS:
            return _DYNAMIC
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                found = node
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            found = node
    return found


def _top_level(body: list[ast.stmt]):
    """Every node of the module's own scope: into if/try/with/for blocks, not into defs or classes."""
    todo = list(body)
    while todo:
        node = todo.pop(0)
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo[:0] = node.decorator_list  # decorators run in the module's scope; the body does not
            continue
        if not isinstance(node, ast.Lambda):
            todo[:0] = list(ast.iter_child_nodes(node))


def _signature_problem(args: ast.arguments) -> str | None:
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    if len(positional) < 2 and args.vararg is None:
        return f"takes {len(positional)} positional argument{'s' * (len(positional) != 1)}"
    if required > 2:
        return f"requires {required} arguments"
    missing = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    if missing:
        return f"requires the keyword argument{'s' * (len(missing) > 1)} {', '.join(missing)}"
    return None
