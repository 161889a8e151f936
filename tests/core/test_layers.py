"""The layers call down only: no import circle among the modules of the core, of the
gateway, or of the TypeScript client (imports made only for type checking count too:
they are the same dependency)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import busmq
import busmq_gateway

PACKAGE = Path(busmq.__file__).parent
GATEWAY = Path(busmq_gateway.__file__).parent
TYPESCRIPT = Path(__file__).resolve().parents[2] / "clients" / "typescript" / "src"
# `import ... from "./x.js"`, `import type ...`, `export ... from "./x.js"`, over lines.
TS_IMPORT = re.compile(r'^(?:import|export)\b[^;]*?\bfrom\s+"\./([\w/]+)\.js"', re.M | re.S)


def module_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` (dotted, relative to it) and the package's modules it
    imports."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[0] == "v1":  # generated code
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.split(".") if package else []
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                child = f"{target}.{alias.name}" if target else alias.name
                if child in modules:
                    graph[name].add(child)
                elif target in modules:
                    graph[name].add(target)
    return graph


def typescript_imports(source: Path = TYPESCRIPT) -> dict[str, set[str]]:
    """Each module of the TypeScript client (not the generated ``gen/``) and the client's
    modules it imports."""
    modules = {p.stem: p for p in source.glob("*.ts")}
    return {
        name: {m for m in TS_IMPORT.findall(path.read_text()) if m in modules}
        for name, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]


def test_the_finder_reads_the_package() -> None:
    graph = module_imports()
    assert "queue_store" in graph["queue"]
    assert "queue" not in graph["consumer"]


def test_no_import_circle_in_the_package() -> None:
    assert circles(module_imports()) == []


def test_no_import_circle_in_the_typescript_client(tmp_path: Path) -> None:
    graph = typescript_imports()
    assert "transport" in graph["queue"] and "client" not in graph["queue"]
    assert circles(graph) == []
    # The reader sees a circle where there is one, type-only imports included.
    (tmp_path / "a.ts").write_text('import type {\n  B,\n} from "./b.js";\n')
    (tmp_path / "b.ts").write_text('export { A } from "./a.js";\n')
    assert circles(typescript_imports(tmp_path)) == [frozenset({"a", "b"})]


def test_no_import_circle_in_the_gateway() -> None:
    graph = module_imports(GATEWAY)
    assert "fleet" in graph["attachments"]
    assert circles(graph) == []


def test_federated_objects_do_not_import_the_manager_that_makes_them() -> None:
    graph = module_imports()
    for name in ("federation.queue", "federation.channel", "federation.service"):
        assert "federation.manager" not in graph[name]
        assert "bus" not in graph[name]
