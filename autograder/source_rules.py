"""The source rules of lesson 06: what a notebook's code cells must show, read as text and never run.

Standard library only: the grader imports it, and `release` copies it beside the lesson's notebook,
where the visible tests judge the cells the kernel ran (IPython's `In`) with the same rules and the
same messages. Each function takes a list of cell sources, in the order they ran.

- triton_problem(cells, name): None when `name` (triton_attention, or the warm-up triton_softmax), as bound
  when the cells end, only prepares its inputs and launches `@triton.jit` kernels that use only `tl.*`
  operations; else why not.
- flash_problem(cells): None unless `flash_attention`, or anything it reaches by name, can call
  PyTorch's fused attention (best effort); else why.
- online_problem(cells): None unless `online_softmax`, or anything it reaches by name, can call PyTorch's
  softmax (the exercise forbids it; best effort); else why.

How the cells are read:
- IPython's own syntax is read as IPython runs it: the code of `%time`, `%timeit`, `%prun`, `%%time`,
  `%%timeit`, `%%capture` is read as code that may run (a conditional block), magics that run no code of
  the cell (`%matplotlib`, `%load_ext autoreload`, `!pip list`, `x?` ...) are skipped, and any other
  magic makes the cell unreadable (`%run`, `%%writefile`, `!` with redirection ...).
- Python's scoping decides what a name means when the cells end: its last binding at the top level of a
  cell, when no conditional binding (under if, for, try, with, a magic) or `global` can come after it.
  A module is trusted under any name and imported any number of times, as long as every top-level
  binding of that name imports the same module. Names bound inside functions are theirs alone.
- Whatever cannot be read (a cell too large or nested too deeply, a cell that does not parse) is refused
  with a message, never a crash: MAX_CELL_CHARS, MAX_TOTAL_CHARS and MAX_DEPTH bound the work.
- Code loaded where the rules cannot read it is refused, in any cell: an import of a file of the working
  folder rather than an installed module (a module the cells wrote, a file beside the notebook, as the
  visible tests see it; the grader's sandbox puts no writable folder on sys.path, so there such an import
  fails, as one of a package the grader lacks does), a relative import, modules that run files or bytes
  (runpy, importlib, pickle, ...), and sys.path, sys.modules or `sys` itself used other than read by name.
- A genuine module or class is followed wherever the cells pass it (Flow): through an alias, an argument,
  a default, a container, an object's attribute, a function's result; changing an attribute of anything
  that may be one (not a literal flag, not os.environ) is refused. Passing a module to a helper that only
  reads it is not.

- Code run where no reading sees it is refused, in any cell (_hidden_code_problem): exec, eval, compile;
  unpickling (torch.load with weights_only other than True, numpy's allow_pickle, a pickle_module,
  pandas.read_pickle, marshal); code placed between torch and its callers, where the checks record the ops
  a call runs (a TorchFunctionMode or TorchDispatchMode, `__torch_function__`, torch.library, torch._C), or
  over the frames that call it (sys.settrace/setprofile, sys._getframe, frame attributes, gc's object
  lists: gc.collect() is fine).
- The lesson's own code, as its notebook has it, is excused from these readings (COURSE_CODE): the OpLog cell,
  and the demonstrations' guard `answered`, which reads `vars` and `__code__` of the answers it is given.
  A timer's code given as a literal string (timeit.timeit('f(x)'), cProfile.run, torch's benchmark Timer)
  is read as code that may run; code given as anything but a function or a literal is refused.

What still hides from a reading (an attribute taken by a computed name, getattr(torch, name)) is left to
the run-time checks of the values; the verdict only concerns what the lesson teaches.
"""
import ast
import hashlib
import importlib.machinery
import os
import re
import sys
import textwrap
import threading
import types

MAX_CELL_CHARS = 100_000     # an honest lesson 06 notebook: 45,000 characters of code in all, 5,300 in one cell
MAX_TOTAL_CHARS = 300_000
MAX_DEPTH = 100              # nesting of the syntax tree; honest code stays under 30

# Canonical names (where the module's own import puts them) of what the rules trust.
WRAPPER_CALLS = {"torch.empty_like", "torch.empty", "torch.zeros_like", "torch.zeros", "triton.cdiv",
                 "triton.next_power_of_2", "math.sqrt", "math.log2", "math.log", "math.ceil", "max", "min", "int",
                 "float", "len", "tuple", "dict", "isinstance", "str", "bool", "ValueError", "RuntimeError",
                 "TypeError", "print"}
ALLOCATIONS = {"torch.empty_like", "torch.empty", "torch.zeros_like", "torch.zeros"}
TENSOR_METHODS = {"contiguous", "stride", "size", "dim", "numel", "element_size", "is_contiguous"}
KERNEL_BUILTINS = {"range", "min", "max", "float", "int"}
KERNEL_METHODS = {"to"}
KERNEL_MODULES = ("triton", "math")  # what a kernel may name besides its own arguments and tl.*
BUILTINS = {name for name in WRAPPER_CALLS | KERNEL_BUILTINS if "." not in name} | {"SimpleNamespace"}
DYNAMIC = {"exec", "eval", "compile", "setattr", "delattr", "globals", "vars", "locals", "__import__",
           "__builtins__", "importlib", "ctypes", "get_ipython"}
DUNDERS = {"__dict__", "__globals__", "__code__", "__builtins__", "__class__", "__bases__", "__subclasses__",
           "__closure__", "__defaults__", "__kwdefaults__", "__wrapped__", "__self__", "__func__", "__mro__",
           "__getitem__", "__call__", "__setitem__"}
REWRITERS = {"builtins", "inspect", "importlib", "ctypes", "imp", "marshal"}  # gc: only gc.collect() (below)
# The setup cell's stand-ins, allowed only in `except ImportError` after `import triton` (never run by a
# grader that has Triton, which is the only grader that runs the Triton check).
STAND_INS = {"triton = SimpleNamespace(jit=lambda fn: fn)", "tl = SimpleNamespace(constexpr=None)"}
# What flash_attention must not reach: PyTorch's fused attention, or the means to name it without saying so.
FUSED_CALLS = {"scaled_dot_product_attention", "getattr", "__import__", "eval", "exec"}
# What online_softmax must not reach: PyTorch's softmax, under any of its names, or the means to name it unseen.
UNSEEN_CALLS = {"getattr", "__import__", "eval", "exec"}
SOFTMAX_CALLS = {"softmax", "_softmax", "log_softmax", "_log_softmax", "Softmax", "LogSoftmax", "softmin",
                 "Softmin"} | UNSEEN_CALLS
# The hidden-test lines of a test cell, as nbgrader runs them in the instructor's notebook (IPython's In
# holds them); the grader's own sources have no test cells. These exact lines do nothing else. "[.]" keeps
# the hidden line itself out of the copy release gives students.
HIDDEN_TEST_LINE = re.compile(r"^(from autograder[.]checking import verify|verify\('06_gpu', '\w+', globals\(\)\))$", re.M)

# IPython's magics, by what they do with the rest of the cell or line.
CODE_MAGICS = {"time", "timeit", "prun", "capture"}  # run their code (maybe not, maybe many times)
QUIET_MAGICS = {"matplotlib", "config", "load_ext", "autoreload", "aimport", "env", "pwd", "who", "whos", "who_ls",
                "precision", "pip", "conda", "lsmagic", "history", "xmode", "pdb", "magic", "ls", "pinfo", "pinfo2",
                "pdoc", "pdef", "psource", "pfile", "colors", "page", "notebook"}
QUIET_CELL_MAGICS = {"html", "markdown", "latex", "svg", "javascript", "js"}
EXTENSIONS = {"autoreload"}  # %load_ext of anything else imports a module the cells may have written
SHELL_SAFE = re.compile(r"^(pip3?|python3? -m pip|conda) (list|show|freeze|install|--version)\b[^<>|;&`$(){}\n]*$"
                        r"|^(nvidia-smi|nproc|lscpu|free|uname|hostname|python3? --version|pwd|ls|df)\b[^<>|;&`$(){}\n]*$")
TIMEIT_OPTION = re.compile(r"^\s*(?:-[nrp]\s*\d+|-[tcqo])\s*")
PROMPT = re.compile(r"^\s*(>>>|In \[\d+\]:|\.{3,}:)", re.M)


class Unreadable(ValueError):
    """A code cell the grader cannot read as Python: what it defined is unknown."""


# ---- reading cells as IPython runs them ----------------------------------------------------------

def _logical_starts(lines):
    """For each line: whether a new logical line of Python starts there (not inside brackets, a string, or a
    backslash continuation), as Python's tokenizer would see it. Magic lines are judged before being lexed."""
    depth, quote, cont = 0, None, False
    for line in lines:
        starts = depth == 0 and quote is None and not cont
        yield starts, line
        if starts and _escape(line):
            cont = line.rstrip().endswith("\\")
            continue
        i, cont = 0, False
        while i < len(line):
            c = line[i]
            if quote:
                if c == "\\":
                    i += 2
                    continue
                if line.startswith(quote, i):
                    i, quote = i + len(quote), None
                    continue
                if len(quote) == 1 and c == "\n":
                    quote = None
            elif c == "#":
                break
            elif c in "\"'":
                quote = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else c
                i += len(quote)
                continue
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth = max(0, depth - 1)
            i += 1
        if quote and len(quote) == 1:
            quote = None  # an unterminated one-line string: the parser will say so
        cont = quote is None and line.rstrip("\n").endswith("\\")


MAGIC_ASSIGN = re.compile(r"^\s*[\w.\[\], ()*]+?\s*=\s*(?=[%!])")


def _escape(line):
    """The IPython escape a logical line starts with ('%', '!', '?', ...), or None."""
    text = line.lstrip()
    m = MAGIC_ASSIGN.match(line)
    if m and "==" not in line[:m.end()]:
        return text[len(m.group(0).lstrip()):][:1] or None
    if text[:1] in ("%", "!", "?", "/", ",", ";") and not text.startswith("%="):
        return text[:1]
    stripped = text.split("#")[0].rstrip()
    if stripped.endswith("?") and re.fullmatch(r"\??[\w.]+\?\??", stripped):
        return "?"
    return None


def _magic_code(name, rest, number):
    """The code a code-running magic runs (text), after its options."""
    if name in ("timeit", "prun"):
        while True:
            m = TIMEIT_OPTION.match(rest)
            if not m or not m.group(0).strip():
                break
            rest = rest[m.end():]
        if name == "prun":
            rest = re.sub(r"^(\s*-[slTD]\s+\S+)+", "", rest)
    return rest


def _magic(text, number):
    """A line magic, shell escape or help line: None when it runs no code of the cell, else its code."""
    body = MAGIC_ASSIGN.sub("", text, count=1).strip()
    if body.startswith("?") or body.endswith("?"):
        return None
    if body.startswith("!"):
        command = body.lstrip("!").strip()
        if SHELL_SAFE.match(command):
            return None
        raise Unreadable(f"code cell {number} runs the shell command `!{command[:40]}`, which the grader cannot "
                         "read (only pip list/show/install and a few read-only commands are read): remove it")
    if not body.startswith("%"):
        raise Unreadable(f"code cell {number} uses IPython's `{body[:1]}` shortcut, which the grader cannot read: "
                         "write the call out in Python")
    name, _, rest = body.lstrip("%").partition(" ")
    if name in CODE_MAGICS - {"capture"}:
        return _magic_code(name, rest, number)
    if name == "aimport":  # autoreload's import: read as the import it is
        modules = [m for m in rest.replace(",", " ").split() if not m.startswith("-")]
        return "import " + ", ".join(modules) if modules else None
    if name == "sx" or name == "system":
        return _magic("!" + rest, number)
    if name in QUIET_MAGICS and (name != "load_ext" or rest.strip() in EXTENSIONS) \
            and (name not in ("pip", "conda") or SHELL_SAFE.match(body.lstrip("%"))):
        return None
    raise Unreadable(f"code cell {number} uses the magic `%{name}`, whose effect the grader cannot read: "
                     "remove it from your notebook")


def _assigned(text, code):
    """`x = %magic ...` binds x as well as running the magic's code (if any)."""
    m = MAGIC_ASSIGN.match(text)
    if not m:
        return code
    return m.group(0).strip() + " __magic__\n" + (code or "")


def _cell_text(text, number):
    """IPython's cleanup of a cell (leading empty lines and common indentation), then the cell as Python
    text, with every magic line replaced by a placeholder and {placeholder line: the magic's code or None}."""
    lines = text.splitlines(keepends=True)
    while lines and not lines[0].strip():
        lines.pop(0)
    lines = textwrap.dedent("".join(lines)).splitlines(keepends=True)
    if PROMPT.search("".join(lines)):
        raise Unreadable(f"code cell {number} holds pasted prompts (>>>, In [1]:), which IPython removes and the "
                         "grader does not: remove them")
    if lines and lines[0].startswith("%%"):
        name, _, rest = lines[0][2:].strip().partition(" ")
        body = "".join(lines[1:])
        if name in QUIET_CELL_MAGICS:
            return "", {}
        if name not in CODE_MAGICS:
            raise Unreadable(f"code cell {number} is a `%%{name}` cell, whose effect the grader cannot read: "
                             "remove the magic, or the cell")
        if name == "timeit" and _magic_code(name, rest, number).strip():
            body = _magic_code(name, rest, number) + "\n" + body  # its setup line runs too
        return "__magic__(0)\n", {0: ("cell", body)}
    out, magics, pending = [], {}, None
    for number_of_line, (starts, line) in enumerate(_logical_starts(lines), 1):
        if pending is not None:  # a magic continued with a backslash
            pending = pending[:-1] + line.rstrip("\n") if pending.endswith("\\") else pending
            out.append("\n")
            if not line.rstrip().endswith("\\"):
                magics[key] = ("line", _assigned(pending, _magic(pending, number)))  # noqa: F821 - set with pending
                pending = None
            continue
        if starts and _escape(line):
            indent = line[:len(line) - len(line.lstrip())]
            key = len(out) + 1
            out.append(f"{indent}__magic__({key})\n")
            text_of = line.strip()
            if text_of.endswith("\\"):
                pending = text_of
                continue
            magics[key] = ("line", _assigned(text_of, _magic(text_of, number)))
            continue
        out.append(line)
    if pending is not None:
        magics[key] = ("line", _assigned(pending, _magic(pending.rstrip("\\"), number)))
    return "".join(out), magics


def _parse(text, number, nested=0):
    """The cell's syntax tree, magics replaced by `if __magic__:` blocks holding the code they run."""
    python, magics = _cell_text(text, number)
    tree = ast.parse(python)
    blocks = {}
    for key, (kind, code) in magics.items():
        if code is None:
            blocks[key] = []
        elif nested > 2:
            raise Unreadable(f"code cell {number} nests magics too deeply for the grader to read")
        else:
            inner = _parse(code, number, nested + 1) if kind == "cell" else ast.parse(code.strip() or "pass")
            blocks[key] = [ast.If(test=ast.Name("__magic__", ast.Load()), body=inner.body or [ast.Pass()], orelse=[])]
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and any(_placeholder(s) is not None for s in stmts):
                new = []
                for s in stmts:
                    key = _placeholder(s)
                    new += blocks.get(key, []) if key is not None else [s]
                setattr(node, field, new or [ast.Pass()])
    return tree


def _placeholder(stmt):
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) \
            and stmt.value.func.id == "__magic__" and stmt.value.args and isinstance(stmt.value.args[0], ast.Constant):
        return stmt.value.args[0].value
    return None


def _depth(tree):
    """The nesting depth of a syntax tree, without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, d = todo.pop()
        if d > MAX_DEPTH:
            return d
        deepest = max(deepest, d)
        todo += [(child, d + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def read_cells(sources, drop_hidden_tests=True):
    """The syntax tree of each code cell, as IPython runs it; Unreadable (with the message for the student)
    for a cell that does not parse, is too large or nested too deeply, or uses a magic the rules cannot read."""
    sources = [str(s) for s in sources]
    total = sum(len(s) for s in sources)
    if total > MAX_TOTAL_CHARS:
        raise Unreadable(f"your code cells hold {total:,} characters, more than the {MAX_TOTAL_CHARS:,} the grader "
                         "reads: move large data into a file and keep the cells for code")
    trees = []
    for number, text in enumerate(sources, 1):
        if len(text) > MAX_CELL_CHARS:
            raise Unreadable(f"code cell {number} holds {len(text):,} characters, more than the {MAX_CELL_CHARS:,} "
                             "the grader reads in one cell: split it, or move large data into a file")
        if drop_hidden_tests:
            text = HIDDEN_TEST_LINE.sub("", text)
        try:
            tree = _parse(text, number)
            if _depth(tree) > MAX_DEPTH:
                raise Unreadable(f"code cell {number} nests expressions more than {MAX_DEPTH} deep, more than the "
                                 "grader reads: break the expression up")
        except (RecursionError, MemoryError):
            raise Unreadable(f"code cell {number} nests expressions too deeply (or is too large) for the grader to "
                             "read: break it up") from None
        except (SyntaxError, ValueError, OverflowError) as e:
            if isinstance(e, Unreadable):
                raise
            why = getattr(e, "msg", None) or type(e).__name__
            raise Unreadable(f"code cell {number} does not parse as Python ({why}), so the grader cannot tell what "
                             "it defined: fix or delete it") from None
        trees.append(tree)
    return trees


# ---- what each name means when the cells end -----------------------------------------------------

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp)
CONDITIONAL = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith, ast.Match,
               getattr(ast, "TryStar", ast.Try), ast.IfExp, ast.BoolOp, ast.ExceptHandler, ast.match_case)


def _names_bound_by(node):
    """The names this one node binds (its children not included)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def _imported(node, name):
    """The module path an import statement binds `name` to ('torch.nn.functional'), or None."""
    for a in node.names:
        bound = (a.asname or a.name).split(".")[0]
        if bound != name or a.name == "*":
            continue
        if isinstance(node, ast.ImportFrom):
            return None if node.level else f"{node.module}.{a.name}"
        return a.name if a.asname else a.name.split(".")[0]
    return None


class Cells:
    """The cells' bindings, read once: for each name, its top-level bindings in order, as (node, statement,
    conditional), and the names some function declares global (they may change at any call)."""

    def __init__(self, trees):
        self.trees = trees
        self.top, self.globals_declared, self.all_nodes = {}, set(), []
        self.top_defs = {id(s) for tree in trees for s in tree.body}
        self._flow, self._modules, self._once, self._resolved = None, {}, {}, {}
        for tree in trees:
            todo = [(stmt, stmt, False, True) for stmt in reversed(tree.body)]
            while todo:
                node, stmt, conditional, module_scope = todo.pop()
                self.all_nodes.append(node)
                if isinstance(node, ast.Global):
                    self.globals_declared |= set(node.names)
                if module_scope:
                    for name in _names_bound_by(node):
                        if not isinstance(node, ast.arg):
                            self.top.setdefault(name, []).append((node, stmt, conditional))
                inner = module_scope and not isinstance(node, SCOPES)
                inner_conditional = conditional or isinstance(node, CONDITIONAL)
                children = list(ast.iter_child_nodes(node))
                if isinstance(node, SCOPES) and module_scope:
                    # decorators, defaults and a comprehension's first iterable run in the enclosing scope
                    outer = [*getattr(node, "decorator_list", []), *getattr(node, "bases", []),
                             *(getattr(node, "args", None) and [*node.args.defaults, *node.args.kw_defaults] or [])]
                    outer = [n for n in outer if n is not None]
                    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                        walrus = [n for n in ast.walk(node) if isinstance(n, ast.NamedExpr)]
                        for w in walrus:  # a walrus in a comprehension binds in the enclosing scope
                            self.top.setdefault(w.target.id, []).append((w.target, stmt, True))
                    todo += [(c, stmt, conditional, c in outer) for c in reversed(children)]
                    continue
                next_stmt = lambda c: c if isinstance(c, ast.stmt) else stmt  # noqa: E731
                todo += [(c, next_stmt(c), inner_conditional and c is not getattr(node, "test", None)
                          and not (isinstance(node, (ast.For, ast.AsyncFor)) and c is node.iter)
                          and not (isinstance(node, (ast.With, ast.AsyncWith)) and c in node.items[:1]),
                          inner) for c in reversed(children)]

    def final(self, name):
        """The statement that binds `name` when the cells end: a top-level def, class, import or assignment;
        None when nothing binds it (a builtin); 'ambiguous' when a conditional binding, a `del` or a `global`
        can come after the last sure one."""
        if name in self.globals_declared:
            return "ambiguous"
        found = self.top.get(name, [])
        sure = [i for i, (node, stmt, cond) in enumerate(found) if not cond]
        if not found:
            return None
        if not sure or sure[-1] != len(found) - 1:
            return "ambiguous"
        node, stmt, _ = found[-1]
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del):
            return "deleted"
        return stmt

    def once(self, reading, *args):
        """reading(self, *args), worked out once for every rule that asks: the cells do not change."""
        if (reading, *args) not in self._once:  # a tuple, not a starred index: Python 3.10 reads this file
            self._once[(reading, *args)] = reading(self, *args)
        return self._once[(reading, *args)]

    def flow(self):
        """What may hold a genuine module when the cells run (Flow), read once for every rule (a cell it cannot
        follow too: Unreadable, raised again to each rule rather than read again)."""
        if self._flow is None:
            try:
                self._flow = Flow(self)
            except Unreadable as e:
                self._flow = e
        if isinstance(self._flow, Unreadable):
            raise self._flow
        return self._flow

    def module(self, name):
        """The module path `name` means when the cells end ('torch', 'triton.language'), or None: every top-level
        binding imports the same module (or is the setup cell's stand-in for it), and no function rebinds it.
        Read once per name: every name the cells use asks, and a name bound thousands of times costs a pass."""
        if name not in self._modules:
            self._modules[name] = None if name in self.globals_declared else self._module(name)
        return self._modules[name]

    def _module(self, name):
        paths = set()
        for node, stmt, _ in self.top.get(name, []):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                paths.add(_imported(node, name))
            elif not self._stand_in(node, stmt):
                return None
        return paths.pop() if len(paths) == 1 and None not in paths else None

    def _stand_in(self, node, stmt):
        return isinstance(node, ast.Name) and isinstance(stmt, ast.Assign) and ast.unparse(stmt) in STAND_INS \
            and any(stmt in h.body for t in self.trees for n in ast.walk(t) if isinstance(n, ast.Try)
                    and any(isinstance(b, ast.Import) and ast.unparse(b) == "import triton" for b in n.body)
                    for h in n.handlers if isinstance(h.type, ast.Name) and h.type.id == "ImportError")

    def resolve(self, node):
        """The canonical dotted name of a Name/Attribute chain ('torch.empty_like' for T.empty_like after
        `import torch as T`; 'max' for the genuine builtin), or None when its root is not trusted. Every link of a
        chain is resolved in the one walk down it and remembered: the rules ask for each link, and walking the
        chain for each would be quadratic in its length (issue 33)."""
        if isinstance(node, ast.Name):
            root = self.module(node.id)
            if root is None and node.id in BUILTINS and not self.top.get(node.id) \
                    and node.id not in self.globals_declared:
                return node.id
            return root
        chain = []
        while isinstance(node, ast.Attribute) and id(node) not in self._resolved:
            chain.append(node)
            node = node.value
        if isinstance(node, ast.Attribute):
            path = self._resolved[id(node)][1]
        else:
            path = self.module(node.id) if isinstance(node, ast.Name) else None
        for link in reversed(chain):
            path = None if path is None else f"{path}.{link.attr}"
            self._resolved[id(link)] = (link, path)  # the node kept with it: its id is never reused
        return path


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


# ---- what may hold a genuine module, and what changes one ------------------------------------------

# Builtins that read their arguments and never return or call them: passing a module to these is only reading.
READERS = {"print", "len", "str", "repr", "isinstance", "issubclass", "hasattr", "callable", "id", "hash", "bool",
           "int", "float", "format", "round", "abs", "dir", "help"}
# Where Python finds and loads modules: changing these lets an import run a file the cells wrote.
IMPORT_MACHINERY = {"path", "meta_path", "path_hooks", "path_importer_cache", "modules"}
# Modules that run code from files or bytes, or change modules by name, where the rules cannot see it.
LOADERS = {"importlib", "imp", "runpy", "zipimport", "pkgutil", "site", "pickle", "_pickle", "shelve", "dill",
           "cloudpickle", "unittest", "marshal", "copyreg", "joblib", "code", "codeop", "doctest", "pdb", "bdb",
           "trace", "ctypes", "_ctypes", "cffi", "builtins"}
OWN_MODULES = {"source_rules"}  # the course's own module beside the notebook (its visible tests import it)
MAX_PASSES = 10  # the module-flow reading converges in 2 or 3 passes on honest code
# ...and visits each node once a pass: passes times nodes is bounded too, so that no submission's cells (a chain of
# aliases written backwards, one name a pass) cost the grader seconds. An honest lesson 06 notebook has about
# 11,000 nodes; this allows ten passes up to 25,000 and three up to 83,000.
MAX_VISITS = 250_000
_MISSING = object()


# The dtypes of torch and Triton are instances, never modules or classes. Named here so that `x.to(tl.float32)`
# reads the same on a grader without Triton installed as on one with it: an argument that may be a module, handed
# to a method the rules cannot follow, reaches every function's parameters.
DTYPES = {"torch": {"float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16",
                    "int32", "int64", "uint8", "bool", "long", "int", "short", "complex64", "complex128"},
          "triton.language": {"float16", "float32", "float64", "bfloat16", "int1", "int8", "int16", "int32",
                              "int64", "uint8", "uint16", "uint32", "uint64", "float8e5", "float8e4nv"}}


def _genuine_may_be_module(path):
    """Whether the genuine object at the dotted `path` ('torch.nn', 'torch.float32') may be a module or a class,
    whose attributes other code reads: looked up, never imported, in the modules this process has loaded; what
    is not loaded here may be one, unless it is one of DTYPES. (The grader reads the cells where the notebook
    ran, with what it imported loaded; check_submission.py loads torch and Triton first, to read them alike.)"""
    owner, _, last = path.rpartition(".")
    if last in DTYPES.get(owner, ()):
        return False
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is not None:
            break
    else:
        return True
    for part in parts[i:]:
        obj = getattr(obj, "__dict__", {}).get(part, _MISSING)
        if obj is _MISSING:
            return True
    return isinstance(obj, (types.ModuleType, type))


def _beside_the_notebook(name):
    """Whether the top-level module `name` is a file of the working folder (where a notebook's cells write theirs,
    which a kernel imports before any installed module), not the standard library or an installed package. One
    that is nowhere fails to import in the grader's sandbox, which puts no writable folder on sys.path."""
    if name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ()):
        return False
    here = os.getcwd()
    return os.path.isfile(os.path.join(here, name, "__init__.py")) or any(
        os.path.isfile(os.path.join(here, name + suffix)) for suffix in importlib.machinery.all_suffixes())


class Flow:
    """What may hold a genuine module or class when the cells run, read without running them: names, by Python's
    scoping (a function's parameters and locals are its own), and attribute names (`.m` once something stores
    one in an attribute `m`, on any object) that may be bound to one, and the functions whose result may be one,
    found as a fixed point over every binding: assignments, loops, with-as, arguments passed to a function (its
    parameters; every function's, when the call's target cannot be followed), defaults, returns, containers and
    calls that may return their arguments (`dict(t=torch)`, `g()` of a `def g(): return torch`)."""

    def __init__(self, cells):
        self.cells, self.names, self.attrs, self.returns = cells, set(), set(), set()
        self.defs, self.methods, self.classes = {}, set(), set()
        self.nodes, self.enclosing, self.locals, self.returned_by, self._may = [], {}, {}, {}, {}
        todo = [(stmt, None) for tree in reversed(cells.trees) for stmt in reversed(tree.body)]
        while todo:  # every node with the function it runs in (None: the top level)
            node, scope = todo.pop()
            self.nodes.append((node, scope))
            inner = scope
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self.enclosing[id(node)], inner = scope, node
                self.locals[id(node)] = set()
                if scope is not None and not isinstance(node, ast.Lambda):
                    self.locals[id(scope)].add(node.name)
            elif scope is not None and not isinstance(node, ast.arg):
                self.locals[id(scope)].update(_names_bound_by(node))
            if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) and scope is not None:
                self.returned_by[id(node)] = getattr(scope, "name", None)
            outer = []  # decorators and defaults run where the function is defined
            if inner is not scope:
                a = node.args
                outer = [*getattr(node, "decorator_list", []), *a.defaults, *(d for d in a.kw_defaults if d)]
                self.locals[id(node)].update(p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg,
                                                               a.kwarg) if p is not None)
            todo += [(c, scope if any(c is o for o in outer) else inner)
                     for c in reversed(list(ast.iter_child_nodes(node)))]
        for node, scope in self.nodes:
            if isinstance(node, (ast.Global, ast.Nonlocal)) and scope is not None:
                self.locals[id(scope)] -= set(node.names)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.ClassDef):
                self.classes.add(node.name)
                for stmt in node.body:
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.methods.add(id(stmt))
                        self.defs.setdefault(f"{node.name}.", []).append(stmt)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.defs.setdefault(t.id, []).append(node.value)
        self.functions = [n for n, _ in self.nodes
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        self.every_parameter = False
        for node, scope in self.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                for a in node.names:
                    path = a.name if isinstance(node, ast.Import) else f"{node.module}.{a.name}"
                    if a.name != "*" and _genuine_may_be_module(path if a.asname or isinstance(node, ast.ImportFrom)
                                                                else a.name.split(".")[0]):
                        self.names.add(self.key((a.asname or a.name).split(".")[0], scope))
        for _ in range(min(MAX_PASSES, MAX_VISITS // max(len(self.nodes), 1))):
            before = (len(self.names), len(self.attrs), len(self.returns))
            for node, scope in self.nodes:
                self._visit(node, scope)
            if (len(self.names), len(self.attrs), len(self.returns)) == before:
                return
        raise Unreadable("your code passes modules through more names than the grader follows: simplify it")

    def key(self, name, scope):
        """(the function whose local `name` is, or None for the cells' top level, name)."""
        while scope is not None:
            if name in self.locals[id(scope)]:
                return id(scope), name
            scope = self.enclosing[id(scope)]
        return None, name

    # -- what may be a module --
    def may(self, node, scope=None):
        """Whether the expression may evaluate to a genuine module or class, or to a container holding one.
        Remembered per node until what the flow knows grows (its sets only grow): an expression nested n deep is
        asked about at each level, and reading it again at each would be quadratic in n (issue 33)."""
        known = (len(self.names), len(self.attrs), len(self.returns))
        memo = self._may.get((id(node), id(scope)))
        if memo is None or memo[0] != known:
            memo = (known, self._may_read(node, scope), node)  # the node kept with it: its id is never reused
            self._may[id(node), id(scope)] = memo
        return memo[1]

    def _may_read(self, node, scope):
        if isinstance(node, ast.Name):
            return self.key(node.id, scope) in self.names
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            chain, root = [], node
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                if isinstance(root, ast.Attribute):
                    if root.attr in self.attrs:
                        return True
                    chain.append(root.attr)
                else:
                    chain.append(None)
                root = root.value
            if isinstance(root, ast.Name) and self.key(root.id, scope) == (None, root.id) and None not in chain \
                    and (None, root.id) in self.names and self.cells.module(root.id) is not None:
                return _genuine_may_be_module(".".join([self.cells.module(root.id), *reversed(chain)]))
            return self.may(root, scope)
        if isinstance(node, ast.Call):
            func = node.func
            builtin = isinstance(func, ast.Name) and not self.cells.top.get(func.id)
            if builtin and func.id in ("type", "getattr", "vars"):
                return True
            if builtin and func.id in READERS:
                return False
            if isinstance(func, ast.Name) and func.id in self.classes:
                return False  # an instance (what it keeps in its attributes is followed by attribute name)
            if isinstance(func, (ast.Name, ast.Attribute)) and getattr(func, "id", getattr(func, "attr", "")) \
                    in self.returns:
                return True  # g() or obj.g() of a def g that may return a module
            if isinstance(func, ast.Attribute) and self.cells.resolve(func) is None and self.may(func.value, scope):
                return True  # a method of what may hold a module (d.get('t'), mods.pop())
            return any(self.may(a, scope) for a in self._arguments(node))
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Starred, ast.IfExp, ast.BoolOp, ast.NamedExpr,
                             ast.Await, ast.Dict, ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            parts = {ast.IfExp: lambda n: [n.body, n.orelse], ast.ListComp: lambda n: [n.elt],
                     ast.SetComp: lambda n: [n.elt], ast.GeneratorExp: lambda n: [n.elt],
                     ast.DictComp: lambda n: [n.key, n.value], ast.Dict: lambda n: n.values,
                     ast.NamedExpr: lambda n: [n.value]}.get(type(node), lambda n: list(ast.iter_child_nodes(n)))
            return any(p is not None and self.may(p, scope) for p in parts(node))
        return False

    @staticmethod
    def _arguments(call):
        return [*call.args, *(k.value for k in call.keywords)]

    # -- how it spreads --
    def _bind(self, target, scope):
        """The target of a binding whose value may be a module: a name, or what an attribute or item is stored in."""
        if isinstance(target, ast.Name):
            self.names.add(self.key(target.id, scope))
        elif isinstance(target, ast.Attribute):
            self.attrs.add(target.attr)
        elif isinstance(target, (ast.Subscript, ast.Starred)):
            self._bind(target.value, scope)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._bind(t, scope)

    def _params(self, fn, with_self=True):
        a = fn.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
        if not with_self and id(fn) in self.methods and (a.posonlyargs or a.args):
            params = params[1:]
        self.names.update((id(fn), p.arg) for p in params if p is not None)

    def _bound_params(self, fn, call, scope, with_self=True):
        """The parameters of fn that a direct call hands what may be a module, argument by argument."""
        a = fn.args
        positional = [*a.posonlyargs, *a.args]
        if not with_self and id(fn) in self.methods:
            positional = positional[1:]
        named = {p.arg: p for p in [*positional, *a.kwonlyargs]}
        hit = []
        for i, arg in enumerate(call.args):
            if self.may(arg, scope):
                if isinstance(arg, ast.Starred):
                    return self._params(fn, with_self)
                hit.append(positional[i] if i < len(positional) else a.vararg)
        for k in call.keywords:
            if self.may(k.value, scope):
                if k.arg is None:
                    return self._params(fn, with_self)
                hit.append(named.get(k.arg, a.kwarg))
        self.names.update((id(fn), p.arg) for p in hit if p is not None)

    def _visit(self, node, scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            if node.value is not None and self.may(node.value, scope):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    self._bind(t, scope)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            if self.may(node.iter, scope):
                self._bind(node.target, scope)
        elif isinstance(node, ast.withitem):
            if node.optional_vars is not None and self.may(node.context_expr, scope):
                self._bind(node.optional_vars, scope)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            defaults = list(zip(reversed([*a.posonlyargs, *a.args]), reversed(a.defaults)))
            defaults += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            self.names.update((id(node), p.arg) for p, d in defaults if self.may(d, scope))
            if isinstance(node, ast.Lambda) and self.may(node.body, node):
                self.returns.update(name for name, fns in self.defs.items() if any(f is node for f in fns))
        elif isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) and node.value is not None \
                and self.returned_by.get(id(node)) and self.may(node.value, scope):
            self.returns.add(self.returned_by[id(node)])
        elif isinstance(node, ast.Call):
            self._call(node, scope)

    def _passed(self, args):
        """The functions handed to a call with the module (map(f, [torch]), functools.partial(f, torch))."""
        for a in args:
            for fn in ([a] if isinstance(a, ast.Lambda) else self.defs.get(getattr(a, "id", None), [])):
                self._params(fn)

    def _call(self, node, scope):
        """A call that passes something that may be a module: the parameters it may reach may hold one."""
        args = self._arguments(node)
        if not any(self.may(a, scope) for a in args):
            return
        func = node.func
        if isinstance(func, ast.Name) and func.id in READERS and not self.cells.top.get(func.id):
            return
        if isinstance(func, ast.Name) and func.id in self.classes:  # C(torch): __init__'s parameters, not self
            for fn in self.defs.get(f"{func.id}.", []):
                self._bound_params(fn, node, scope, with_self=False)
            return
        if isinstance(func, ast.Name) and func.id in self.defs:  # f(torch): f's parameters
            for fn in self.defs[func.id]:
                self._bound_params(fn, node, scope)
            return
        if self.cells.resolve(func) is not None or (isinstance(func, ast.Attribute) and self.may(func.value, scope)):
            # a builtin, a genuine function or a method of what may be a module (lib.sqrt(x), mods.append(m)):
            # the functions it was handed with the module
            self._passed(args)
            return
        if isinstance(func, (ast.Attribute, ast.Subscript)):
            self._bind(func.value, scope)  # mods.append(torch), obj.keep(torch): the object now holds it
            root = func
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.classes:  # C.method(torch): its self too
                for fn in self.defs.get(f"{root.id}.", []):
                    self._params(fn)
                return
        self._passed(args)
        if not self.every_parameter:  # called through a name the rules cannot follow: any function's parameters
            self.every_parameter = True  # (once: the functions are the same at every such call, in every pass)
            for fn in self.functions:
                self._params(fn, with_self=False)


def _literal(node):
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _is_environ(node):
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)


def _parents(cells):
    parents = {}
    for node in cells.all_nodes:
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return parents


def _read_by(up, node):
    """Whether node is an argument of a call that only reads or copies it (print(sys.path), sorted(sys.modules))."""
    return isinstance(up, ast.Call) and node is not up.func and isinstance(up.func, ast.Name) \
        and up.func.id in READERS | {"list", "sorted", "set", "tuple"}


def _loader_problem(cells):
    """Code the cells may load from a file they wrote: an import of a module not installed where the rules run,
    a relative import, a module that runs files, or a change to where Python finds modules."""
    parents = None
    for node in cells.all_nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if getattr(node, "level", 0):
                return "your code uses a relative import (`from . import`), which loads a file the grader cannot read"
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in LOADERS:
                    return (f"your code imports `{top}`, which can run code from a file or change a module where the "
                            "grader cannot read it")
                if top == "sys" and isinstance(node, ast.ImportFrom) and \
                        any(a.name in IMPORT_MACHINERY for a in node.names):
                    return "your code takes sys.path or sys.modules by name, which decide what an import runs"
                if top not in OWN_MODULES and _beside_the_notebook(top):
                    return (f"your code imports `{name}`, a file beside your notebook (or one it wrote), not an "
                            "installed module: the grader has only your notebook and cannot read that code")
        if isinstance(node, ast.Name) and node.id == "__import__":
            return "your code uses `__import__`, which imports what the grader cannot read"
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and cells.module(node.id) == "sys":
            parents = parents or cells.once(_parents)
            up = parents.get(id(node))
            if not isinstance(up, (ast.Attribute, ast.Expr)) and not _read_by(up, node):
                return ("your code passes the `sys` module around (getattr, an alias, an argument): the grader "
                        "reads sys.path and sys.modules only by name")
        if isinstance(node, ast.Attribute) and node.attr in IMPORT_MACHINERY and isinstance(node.value, ast.Name) \
                and cells.module(node.value.id) == "sys":
            parents = parents or cells.once(_parents)
            up = parents.get(id(node))
            reading = isinstance(up, (ast.Expr, ast.Compare)) or _read_by(up, node) or (
                isinstance(up, (ast.For, ast.comprehension)) and node is up.iter)
            if not reading:
                return (f"your code uses `sys.{node.attr}` other than to read it: it decides what an import runs, "
                        "so a changed one can run a file the grader cannot read")
    return None


# ---- code run where a reading cannot see it: from a string, from data, or between torch and its callers ----

# Names that run code given as a string (or hand out the means to).
CODE_FROM_STRINGS = {"exec", "eval", "compile", "get_ipython", "__builtins__", "breakpoint"}
# Calls that run strings as code: {canonical name: (positions, keywords) of the code arguments, position of globals
# or None}. The code of a literal string is read (_with_timed_code); anything else given as code is refused.
TIMERS = {"timeit.timeit": ((0, 1), ("stmt", "setup"), 4), "timeit.repeat": ((0, 1), ("stmt", "setup"), 5),
          "timeit.Timer": ((0, 1), ("stmt", "setup"), 3), "cProfile.run": ((0,), ("statement",), None),
          "cProfile.runctx": ((0,), ("statement",), 1), "profile.run": ((0,), ("statement",), None),
          "profile.runctx": ((0,), ("statement",), 1),
          "torch.utils.benchmark.Timer": ((0, 1, 2), ("stmt", "setup", "global_setup"), 4)}
SHARED_NAMESPACE = {"cProfile.run", "profile.run"}  # they run their code in __main__: the notebook's namespace
# Attribute names a timer or a loader goes by: a call of one on what may be a module but cannot be named is refused.
LOADER_ATTRS = {"timeit", "repeat", "Timer", "run", "runctx", "read_pickle"}
# Loaders of data that unpickle, hence run code, unless told not to: {canonical name: the positional arguments
# they may be given (beyond which come their pickle options)}.
UNPICKLERS = {"torch.load": 2, "torch.serialization.load": 2, "numpy.load": 2, "pandas.read_pickle": -1}
SAFE_KEYWORDS = {"weights_only": True, "allow_pickle": False}  # the one value each may be given
# Where code slips between torch and its callers (the checks record the ops a call runs), or watches the frames
# that call it (the grader's), or runs bytes as code: refused under any name.
INTERCEPTORS = ("torch.overrides", "torch.utils._python_dispatch", "torch._C", "torch.library", "torch._library",
                "torch._ops", "torch._dynamo", "torch.serialization", "sys.setprofile", "sys.settrace",
                "sys._getframe", "sys._current_frames", "sys.monitoring", "sys.call_tracing", "sys.addaudithook",
                "threading.setprofile", "threading.settrace", "inspect.currentframe", "inspect.stack",
                "inspect.trace", "inspect.getouterframes", "inspect.getinnerframes", "traceback.walk_stack",
                "traceback.walk_tb", "types.CodeType", "gc")
INTERCEPTOR_EXCEPTIONS = {"torch.serialization.load", "torch.serialization.save", "gc.collect", "gc.isenabled"}
TORCH_HOOKS = {"__torch_function__", "__torch_dispatch__"}
UNPICKLING_SETTINGS = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}  # makes torch.load's default unpickle
# The lesson's own code that reaches what the rules refuse, as its notebook has it (the sha256 of ast.unparse of a
# top-level statement, cut to 16 digits); nothing else in any cell is excused, not even a copy nested in a block:
# - its "Watch it run" cell's `from torch.utils._python_dispatch import TorchDispatchMode` and
#   `class OpLog(TorchDispatchMode)`, which only records the ops its caller runs (a student's OpLog is not the
#   grader's);
# - the demonstrations' guard `def answered` (solutions/attention.py), which only reads `vars` and `__code__` of
#   the answers it is given, to stop a demonstration that would run a stub.
# An edited statement no longer matches: the honest tests (the OpLog cell) and test_source_rules (answered) say so.
COURSE_CODE = {"aca3d3864942d6db", "8f5d94a6dd665055", "edb66a89833ab5fd"}
FRAME_ATTRS = {"f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "tb_frame", "gi_frame",
               "cr_frame", "ag_frame", "__traceback__", "__code__", "__globals__", "__closure__"}


def _timer_code(cells, call):
    """For a call of a timer (TIMERS): ([(argument, its name)] of what it runs as code, whether that code runs in the
    notebook's namespace); None for any other call."""
    name = cells.resolve(call.func)
    if name not in TIMERS:
        return None
    positions, keywords, globals_at = TIMERS[name]
    code = [(a, f"argument {i + 1}") for i, a in enumerate(call.args) if i in positions or isinstance(a, ast.Starred)]
    code += [(k.value, k.arg or "**") for k in call.keywords if k.arg in keywords or k.arg is None]
    given = [k.value for k in call.keywords if k.arg == "globals"]
    given += call.args[globals_at:globals_at + 1] if globals_at is not None else []
    shared = name in SHARED_NAMESPACE or any(not isinstance(g, ast.Dict) and not _literal(g) for g in given)
    return code, shared


def _is_text(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _with_timed_code(trees):
    """The Cells of the trees, where each literal string a timer runs as code (timeit.timeit('f(x)')) is read as
    code that may run: a conditional block at the end of its cell when it runs in the notebook's namespace, else a
    function of its own. Strings in those strings are read in turn, three deep at most."""
    done = set()
    for _ in range(4):
        cells, found = Cells(trees), False
        for number, tree in enumerate(trees, 1):
            for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call) and id(n) not in done]:
                timed = _timer_code(cells, call)
                done.add(id(call))
                texts = [a.value for a, _ in (timed or ([], False))[0] if _is_text(a)]
                if not texts:
                    continue
                try:
                    body = [s for text in texts for s in ast.parse(textwrap.dedent(text)).body]
                except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
                    raise Unreadable(f"code cell {number} gives `{ast.unparse(call.func)[:40]}` code that does not "
                                     "parse as Python: fix it, or pass a function (lambda: ...)") from None
                block = ast.parse("if __magic__:\n    pass" if timed[1] else "def __timed__():\n    pass").body[0]
                block.body = body or [ast.Pass()]
                tree.body.append(block)
                found = True
        if not found:
            return cells
    raise Unreadable("your code nests code in strings given to timers too deeply for the grader to read")


def _reads_as_function(cells, node):
    """Whether a timer given node as code is given a function the rules can see (a lambda, a def of the cells, a
    genuine function), or a literal string (_with_timed_code reads it)."""
    if isinstance(node, ast.Lambda) or _is_text(node):
        return True
    if isinstance(node, ast.Name) and isinstance(cells.final(node.id), (ast.FunctionDef, ast.Import, ast.ImportFrom)):
        return True
    return isinstance(node, (ast.Name, ast.Attribute)) and cells.resolve(node) is not None


def _intercepts(path):
    return path not in INTERCEPTOR_EXCEPTIONS and any(path == p or path.startswith(p + ".") for p in INTERCEPTORS)


def _course_code(cells):
    """The ids of every node of the top-level statements that are the lesson's own code, as written (COURSE_CODE)."""
    return {id(n) for tree in cells.trees for stmt in tree.body
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.ImportFrom))
            and hashlib.sha256(ast.unparse(stmt).encode()).hexdigest()[:16] in COURSE_CODE for n in ast.walk(stmt)}


def _hidden_code_problem(cells, flow):
    """Code the cells run where no reading can see it: given to exec, eval or a timer as a string built at run time,
    unpickled from a file (torch.load with weights_only=False, numpy's allow_pickle), or placed between torch and
    its callers (a TorchFunctionMode or TorchDispatchMode, __torch_function__, torch.library) or over the frames
    that call it (sys.settrace, sys._getframe, gc's object lists), where it could fake what the checks record."""
    parents, course = cells.once(_parents), cells.once(_course_code)
    for node, scope in flow.nodes:
        if id(node) in course:
            continue
        if isinstance(node, ast.Name) and node.id in CODE_FROM_STRINGS:
            return f"your code uses `{node.id}`, which runs code from a string the grader cannot read"
        if isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRS:
            return f"your code reaches `.{node.attr}`, which reads or rewrites running code (the grader's frames)"
        hook = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
            getattr(node, "id", getattr(node, "attr", node.value if _is_text(node) else None))
        if hook in TORCH_HOOKS:
            return f"your code defines or names `{hook}`, which intercepts torch's calls (what the grader records)"
        if hook in UNPICKLING_SETTINGS:
            return f"your code names `{hook}`, which makes torch.load unpickle, running code the grader cannot read"
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
            paths = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names]
            found = next((p for p in paths if _intercepts(p) and p != "gc"), None)  # gc is judged where it is used
            if found:
                return f"your code imports `{found}`, which can intercept torch's calls or reach the code making them"
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            path = cells.resolve(node)
            up = parents.get(id(node))
            if path and _intercepts(path) and not isinstance(up, ast.Attribute) and path != "gc":
                return f"your code uses `{path}`, which can intercept torch's calls or reach the code making them"
            called = isinstance(up, ast.Call) and up.func is node
            if path in (*UNPICKLERS, *TIMERS) and not called:
                return (f"your code passes `{path}` around: the grader reads what it runs only where it is "
                        "called by name")
            if path == "gc" and not isinstance(up, ast.Attribute):
                return "your code passes the `gc` module around: the grader allows only gc.collect()"
        if not isinstance(node, ast.Call):
            continue
        for k in node.keywords:
            if k.arg in SAFE_KEYWORDS and not (isinstance(k.value, ast.Constant)
                                               and k.value.value is SAFE_KEYWORDS[k.arg]):
                return (f"your code calls `{ast.unparse(node.func)[:40]}` with {k.arg}={ast.unparse(k.value)[:30]}: "
                        f"unpickling runs code the grader cannot read (leave {k.arg} at {SAFE_KEYWORDS[k.arg]})")
            if k.arg == "pickle_module":
                return "your code gives a loader its own pickle_module, which runs code the grader cannot read"
        name = cells.resolve(node.func)
        if name in UNPICKLERS and (UNPICKLERS[name] < 0 or len(node.args) > UNPICKLERS[name] or any(
                k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args)):
            return (f"your code calls `{name}` in a way that may unpickle, which runs code the grader cannot read: "
                    "load tensors with torch.load(path) or numpy.load(path) and their default options")
        timed = _timer_code(cells, node)
        for arg, which in (timed or ([], False))[0]:
            if not _reads_as_function(cells, arg):
                return (f"your code gives `{name}` code to run ({which}: `{ast.unparse(arg)[:30]}`) that the grader "
                        "cannot read: pass it a function (lambda: ...) or the code as a literal string")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in LOADER_ATTRS and name is None \
                and flow.may(func.value, scope):
            return (f"your code calls `{ast.unparse(func)[:40]}` on a module the grader cannot name (an alias, an "
                    "argument): call it by its module's name")
    return None


def _changed(node, items):
    """Whether a node of an assignment's target is a change to check: an attribute stored (or any attribute on
    the way, with items), an item (with items), or an item of what a call returned (vars(m)[k] = ...)."""
    if isinstance(node, ast.Attribute):
        return items or isinstance(node.ctx, (ast.Store, ast.Del))
    return isinstance(node, ast.Subscript) and (items or _root(node) is None)


def _patch_problem(cells, flow, items=True):
    """A change to a genuine module or class (or to what may be one), which would change what a trusted name does;
    with items, also a change to an item of something a module holds (plt.rcParams[k] = size, a registry)."""
    for node, scope in flow.nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and not cells.top.get(node.func.id) and node.args and flow.may(node.args[0], scope):
            return f"your code changes an attribute of `{ast.unparse(node.args[0])[:40]}` with {node.func.id}"
        if isinstance(node, ast.Attribute) and node.attr in ("__setattr__", "__delattr__", "__dict__"):
            return f"your code reaches `.{node.attr}`"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            if getattr(node, "value", None) is not None and _literal(node.value):
                continue  # a flag set to a literal (torch.backends.cudnn.allow_tf32 = False) runs no code
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in (t for tt in targets for t in ast.walk(tt) if _changed(t, items)):
                root = _root(t)
                module = cells.module(root) if root else None
                # into a module by name, into what may hold one (an alias, an argument, a call's result), or
                # through something the rules cannot name
                if root is None or (isinstance(t, ast.Attribute) and flow.may(t.value, scope)) or (
                        module is not None and not (module == "os" and isinstance(t, ast.Subscript)
                                                    and _is_environ(t.value))):
                    return f"your code changes `{ast.unparse(t)[:40]}`"
    return None


def _global_problem(cells):
    """Anything in any cell, at any nesting, that could change what the rules trust (the lesson's own code aside)."""
    course = cells.once(_course_code)
    for node in cells.all_nodes:
        if id(node) in course:
            continue
        if isinstance(node, ast.Name) and node.id in DYNAMIC:
            return f"your code uses `{node.id}`"
        if isinstance(node, ast.Attribute) and node.attr in DUNDERS:
            return f"your code reaches `.{node.attr}`"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return "your code uses `import *`"
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names]
            rewriter = next((m for m in mods if m.split(".")[0] in REWRITERS), None)
            if rewriter:
                return f"your code imports `{rewriter}`, a module that can rewrite other code"
    flow = cells.flow()
    return cells.once(_loader_problem) or cells.once(_hidden_code_problem, flow) or cells.once(_patch_problem, flow)


# ---- triton_attention and triton_softmax --------------------------------------------------------------

def _untrusted(cells, func):
    """Why a call's name cannot be trusted when it looks like a trusted one (a builtin or module rebound), or ''."""
    root = _root(func)
    if root is None:
        return ""
    found = cells.top.get(root, [])
    imports = [n for n, _, _ in found if isinstance(n, (ast.Import, ast.ImportFrom))]
    if imports and cells.module(root) is None:
        return (f"your code redefines `{root}` (each top-level binding of it must import the same module, and no "
                "function may rebind it)")
    if root in BUILTINS and (found or root in cells.globals_declared):
        return f"your code redefines `{root}`, a builtin the grader must trust"
    return ""


def _function(cells, name, what):
    """The top-level def that `name` means when the cells end, or the reason there is none."""
    stmt = cells.final(name)
    if stmt is None:
        return None, f"no `def {name}` was found in your notebook's code cells"
    if stmt == "deleted":
        return None, f"`{name}` is deleted (del) after its last definition: the grader finds no {what} to read"
    if stmt == "ambiguous":
        return None, (f"`{name}` is bound under a condition (if, try, for, with, a magic) or by `global` after its "
                      f"last plain definition, so the grader cannot tell which {what} runs: define it once more at "
                      "the top level of a cell, after the others")
    if not isinstance(stmt, ast.FunctionDef) or id(stmt) not in cells.top_defs:
        return None, f"`{name}` must be a function defined at the top level of a cell (its last binding is not)"
    return stmt, None


def _locals(fn):
    return {n for node in ast.walk(fn) if node is not fn for n in _names_bound_by(node)}


def _is_jit(cells, fn):
    """Its one decorator is the genuine triton.jit (or triton.jit(...)): a home-made `jit` proves nothing."""
    if len(fn.decorator_list) != 1:
        return False
    d = fn.decorator_list[0]
    return cells.resolve(d.func if isinstance(d, ast.Call) else d) == "triton.jit"


def _kernel_problem(cells, name, seen):
    """Why the @triton.jit function `name` is not a Triton kernel (None when it is)."""
    if name in seen:
        return None
    seen.add(name)
    kernel, why = _function(cells, name, "kernel")
    if why:
        return why
    if not _is_jit(cells, kernel):
        decorators = kernel.decorator_list
        return (decorators and _untrusted(cells, decorators[0])) or f"`{name}` must be decorated with @triton.jit only (the genuine `import triton`'s)"
    local = _locals(kernel)
    for node in ast.walk(kernel):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Lambda, ast.ClassDef)):
            return f"the kernel `{name}` may only use tl.* operations and arithmetic"
        if isinstance(node, ast.Name) and node.id not in local:
            module = cells.module(node.id)
            if module is not None and not module.startswith(KERNEL_MODULES):
                return f"the kernel `{name}` uses `{node.id}`: a kernel may only use tl.* operations and arithmetic"
        if isinstance(node, ast.Call):
            dotted = cells.resolve(node.func)
            if dotted and (dotted.startswith("triton.language.") or dotted in KERNEL_BUILTINS):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in KERNEL_METHODS:
                continue
            if isinstance(node.func, ast.Name) and node.func.id not in local and cells.module(node.func.id) is None:
                problem = _kernel_problem(cells, node.func.id, seen)
                if problem is None:
                    continue
                return problem
            return _untrusted(cells, node.func) or (
                f"the kernel `{name}` calls `{ast.unparse(node.func)[:60]}`: a kernel may only use tl.* "
                "operations, arithmetic and other @triton.jit functions")
    return None


def _wrapper_problem(cells, fn, kernels, seen):
    """Why the host function fn (triton_attention or a helper it calls) does more than prepare and launch;
    the kernels it launches are added to `kernels`."""
    local = _locals(fn)
    for name in sorted(local):
        if cells.module(name) is not None or (name in BUILTINS and name != fn.name) or name in kernels:
            return f"{fn.name} rebinds `{name}`, which the grader cannot trust in a Triton exercise"
    for node in ast.walk(fn):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            return f"{fn.name} has a loop: it should only prepare the inputs and launch the kernel once"
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.MatMult, ast.Pow)):
            return f"{fn.name} computes with `@` or `**`: leave the arithmetic to the kernel"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, (ast.Subscript, ast.Attribute)) for tt in targets for t in ast.walk(tt)):
                return f"{fn.name} writes into a tensor: only the kernel may write the output"
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Lambda, ast.ClassDef)) \
                or (isinstance(node, ast.FunctionDef) and node is not fn):
            return f"{fn.name} should only prepare the inputs and launch the kernel (it defines or imports)"
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id not in local:
                kernels.add(func.value.id)
                continue
            if cells.resolve(func) in WRAPPER_CALLS:
                continue
            if isinstance(func, ast.Attribute) and func.attr in TENSOR_METHODS and cells.resolve(func) is None:
                continue
            if isinstance(func, ast.Name) and func.id not in local and cells.module(func.id) is None \
                    and func.id not in seen and isinstance(cells.final(func.id), ast.FunctionDef) \
                    and not cells.final(func.id).decorator_list and id(cells.final(func.id)) in cells.top_defs:
                seen.add(func.id)
                found = _wrapper_problem(cells, cells.final(func.id), kernels, seen)
                if found:
                    return found
                continue
            if isinstance(func, ast.Name) and func.id in seen:
                continue
            return _untrusted(cells, func) or (
                f"{fn.name} calls `{ast.unparse(func)[:60]}`: it should only allocate the output, prepare the "
                "inputs and launch a @triton.jit kernel (kernel[grid](...))")
    return None


def _returns_launched_buffer(cells, wrapper):
    allocated, launched_with, returns = {}, set(), []
    for node in ast.walk(wrapper):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for name in (n.id for n in ast.walk(t) if isinstance(n, ast.Name)):
                    fresh = len(node.targets) == 1 and isinstance(t, ast.Name) and isinstance(node.value, ast.Call) \
                        and cells.resolve(node.value.func) in ALLOCATIONS
                    allocated[name] = allocated.get(name, 0) + (1 if fresh else 2)  # rebound: not a clean buffer
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
            target = node.target
            if isinstance(target, ast.Name):
                fresh = isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call) \
                    and cells.resolve(node.value.func) in ALLOCATIONS
                allocated[target.id] = allocated.get(target.id, 0) + (1 if fresh else 2)
        elif isinstance(node, ast.Return) and node.value is not None:
            returns.append(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            launched_with |= {a.id for a in node.args if isinstance(a, ast.Name)}
            launched_with |= {k.value.id for k in node.keywords if isinstance(k.value, ast.Name)}
    return returns and all(isinstance(r, ast.Name) and allocated.get(r.id) == 1 and r.id in launched_with
                           for r in returns)


def _triton_problem(cells, name):
    wrapper, why = _function(cells, name, name)
    if why:
        return why
    if wrapper.decorator_list:
        return f"{name} must not be decorated: a decorator can replace the function the grader reads"
    found = cells.once(_global_problem)
    if found:
        return found + ", which the grader cannot trust in a Triton exercise"
    kernels = set()
    found = _wrapper_problem(cells, wrapper, kernels, {name})
    if found:
        return found
    if not kernels:
        return f"{name} never launches a kernel: call your @triton.jit kernel as kernel[grid](...)"
    for kernel in sorted(kernels):
        found = _kernel_problem(cells, kernel, set())
        if found:
            return found
    if not _returns_launched_buffer(cells, wrapper):
        return (f"{name} should return the output buffer it allocated (torch.empty_like) and passed to the "
                "kernel, as the kernel wrote it")
    return None


# ---- flash_attention ------------------------------------------------------------------------------------

def _fused(node):
    """The name by which this node reaches PyTorch's fused attention (or could, unseen), else None."""
    if isinstance(node, ast.Name):
        names = [node.id]
    elif isinstance(node, ast.Attribute):
        names = [node.attr]
        chain = ast.unparse(node).split(".") if len(node.attr) < 100 else []
        if "attention" in node.attr and ("ops" in chain or "aten" in chain):
            return ".".join(chain)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [part for a in node.names for part in [*a.name.split("."), a.asname or ""]]
        names += (node.module or "").split(".") if isinstance(node, ast.ImportFrom) else []
    else:
        return None
    return next((n for n in names if n in FUSED_CALLS or n.startswith("_scaled_dot_product") or "flash_attn" in n),
                None)


def _softmax_call(node):
    """The name by which this node reaches PyTorch's softmax (or could, unseen), else None. A bare name is
    followed to what binds it (an import, a definition) rather than judged by its spelling."""
    if isinstance(node, ast.Name):
        names = [node.id] if node.id in UNSEEN_CALLS else []
    elif isinstance(node, ast.Attribute):
        names = [node.attr]
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [part for a in node.names for part in [*a.name.split("."), a.asname or ""]]
    else:
        return None
    return next((n for n in names if n in SOFTMAX_CALLS), None)


def _reaches(cells, start, spot):
    """`start reaches ...` when the function `start`, or anything it reaches by name in the cells, holds a node
    that `spot` names (best effort); None otherwise, or why the cells cannot tell."""
    found = cells.once(_loader_problem) or cells.once(_hidden_code_problem, cells.flow()) \
        or cells.once(_patch_problem, cells.flow(), False)
    if found:
        return f"{found}, so the grader cannot tell what {start} calls"
    todo, seen = [], {start}

    def reach(name):
        stmt = cells.final(name)
        if stmt is None or isinstance(stmt, str) or not isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Import,
                                                                           ast.ImportFrom)):
            # not a plain definition: any of its bindings may be the one (a value computed at the top level,
            # a definition under a condition)
            todo.extend(stmt for node, stmt, _ in cells.top.get(name, []))
        else:
            todo.append(stmt)

    reach(start)
    while todo:
        part = todo.pop()
        local = set()  # a function's own arguments and variables are not the cells' names of the same spelling
        if isinstance(part, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local = _locals(part)
        for node in ast.walk(part):
            name = spot(node)
            if name:
                return f"{start} reaches `{name}`"
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in seen | local:
                seen.add(node.id)
                reach(node.id)
    return None


def _flash_problem(cells):
    return _reaches(cells, "flash_attention", _fused)


def _online_problem(cells):
    return _reaches(cells, "online_softmax", _softmax_call)


# ---- the rules, for the grader, the visible tests and check_submission -------------------------------------

# (the sources, their Cells or Unreadable): the grader's two checks read them once. One per thread: grading
# threads never share a reading (one thread's notebook would otherwise be judged by another's cells).
_LAST = threading.local()


def _read(sources):
    key = tuple(str(s) for s in sources)
    last = getattr(_LAST, "read", (None, None))
    if last[0] != key:
        try:
            cells = _with_timed_code(read_cells(key))
            if cells.top.get("verify") or "verify" in cells.globals_declared:
                # a `verify` of the student's own would be handed globals() by the hidden-test line: read it too
                cells = _with_timed_code(read_cells(key, drop_hidden_tests=False))
            last = (key, cells)
        except Unreadable as e:
            last = (key, e)
        _LAST.read = last
    if isinstance(last[1], Unreadable):
        raise last[1]
    return last[1]


def _judge(rule, sources):
    try:
        return rule(_read(sources))
    except Unreadable as e:
        return str(e)
    except (RecursionError, MemoryError):
        return "your code cells are too large or too deeply nested for the grader to read: simplify them"


def triton_problem(sources, name="triton_attention"):
    """None when the cells show a `name` (triton_attention or triton_softmax) that launches a Triton kernel;
    else why not (one line)."""
    return _judge(lambda cells: _triton_problem(cells, name), sources)


def flash_problem(sources):
    """None unless flash_attention, or anything it reaches by name in the cells, calls fused attention."""
    return _judge(_flash_problem, sources)


def online_problem(sources):
    """None unless online_softmax, or anything it reaches by name in the cells, calls PyTorch's softmax."""
    return _judge(_online_problem, sources)


def softmax_problem(sources):
    """None when the cells show a triton_softmax that launches a Triton kernel; else why not (one line)."""
    return triton_problem(sources, "triton_softmax")


RULES = {"triton_attention": triton_problem, "flash_attention": flash_problem, "triton_softmax": softmax_problem,
         "online_softmax": online_problem}


def problems(sources):
    """{graded name: why the rules refuse it} for the lesson's source rules, over a list of cell sources."""
    return {name: found for name, rule in RULES.items() if (found := rule(sources))}
