"""Static checks of the operations files in ops/ (run by test_ops_static.sh).

Nothing here starts a container or talks to a cluster: the files are parsed
and cross-checked against each other and against the worker's config, so that
a number changed in one place (a partition count, a drain grace period, a
metric name, an alert's runbook anchor) cannot silently disagree with another.

Standard library only: CI's python3 has no PyYAML guaranteed, so YAML is read
by a strict parser of the subset the ops files use (block mappings and
sequences, flow collections on one line, quoted and plain scalars, literal and
folded block scalars; no anchors, aliases or tags). Where PyYAML happens to be
installed, every file is parsed by both and the results must agree, which
keeps the subset parser honest.

Usage: python3 ops_static.py <repository root>
"""
import json
import os
import re
import shutil
import subprocess
import sys


# ==== A strict YAML subset =====================================================

class YamlError(Exception):
    pass


_FLOAT = re.compile(r'[-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?|[-+]?\.[0-9_]+([eE][-+][0-9]+)?')
_INT = re.compile(r'[-+]?(0|[1-9][0-9]*)')
# Plain scalars that YAML 1.1 (PyYAML, and Kubernetes' sigs.k8s.io/yaml for
# some) reads as something other than what a reader expects: octal, hex,
# sexagesimal numbers, timestamps and yes/no/on/off booleans. They must be
# quoted in our files.
_AMBIGUOUS = re.compile(
    r'[-+]?0[0-9_]+|[-+]?0[xob][0-9a-fA-F_]+|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?'
    r'|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?|[-+]?[0-9][0-9_]*_[0-9_]*'
    r'|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF')
_DQ_ESCAPES = {'0': '\0', 'a': '\a', 'b': '\b', 't': '\t', 'n': '\n', 'v': '\v', 'f': '\f',
               'r': '\r', 'e': '\x1b', ' ': ' ', '"': '"', '/': '/', '\\': '\\'}


def _is_seq_item(content):
    return content == '-' or content.startswith('- ')


class _YamlParser:
    """One document: `lines` are its raw lines, `first` the file line number of
    lines[0] (for messages)."""

    def __init__(self, path, lines, first):
        self.path = path
        self.lines = lines
        self.first = first
        self.i = 0

    def error(self, idx, msg):
        raise YamlError(f'{self.path}:{self.first + idx + 1}: {msg}')

    # ---- lines ----

    def strip_comment(self, text):
        """text without a trailing comment; '#' starts one only outside quotes
        and after a space (so 'RUNBOOK.md#anchor' stays whole). Quotes open
        only where a scalar starts."""
        quote = None
        token_start = True
        i = 0
        while i < len(text):
            ch = text[i]
            if quote == '"':
                if ch == '\\':
                    i += 1
                elif ch == '"':
                    quote = None
            elif quote == "'":
                if ch == "'":
                    if i + 1 < len(text) and text[i + 1] == "'":
                        i += 1
                    else:
                        quote = None
            elif ch == '#' and (i == 0 or text[i - 1] in ' \t'):
                return text[:i]
            elif ch in '"\'' and token_start:
                quote = ch
            elif ch in '[{,':
                token_start = True
            elif ch in ':-' and (i + 1 == len(text) or text[i + 1] == ' '):
                token_start = True
            elif ch != ' ':
                token_start = False
            i += 1
        return text

    def scan(self, idx):
        """(indent, content) of line idx, or None for a blank or comment line."""
        raw = self.lines[idx]
        body = raw.lstrip(' ')
        if body.startswith('\t'):
            self.error(idx, 'tab in indentation')
        content = self.strip_comment(body)
        if '\t' in content:
            self.error(idx, 'tab outside a block scalar and a comment (use spaces)')
        content = content.rstrip(' ')
        if not content:
            return None
        return len(raw) - len(body), content

    def next_content(self):
        """Index of the next non-blank line from self.i (self.i moves there), or None."""
        while self.i < len(self.lines):
            if self.scan(self.i) is not None:
                return self.i
            self.i += 1
        return None

    # ---- scalars ----

    def resolve_plain(self, text, idx):
        if text in ('', '~', 'null', 'Null', 'NULL'):
            return None
        if text in ('true', 'True', 'TRUE'):
            return True
        if text in ('false', 'False', 'FALSE'):
            return False
        if _INT.fullmatch(text):
            return int(text)
        if _AMBIGUOUS.fullmatch(text):
            self.error(idx, f"quote '{text}': YAML 1.1 reads it as a number, date or boolean")
        if _FLOAT.fullmatch(text):
            return float(text.replace('_', ''))
        if text[0] in '&*!':
            self.error(idx, 'anchors, aliases and tags are not used in the ops files')
        if text[0] in '@`%|>"\',[]{}#' or text == '-' or text.startswith(('? ', '- ', ': ')):
            self.error(idx, f"a plain scalar cannot start with '{text[0]}'")
        if ': ' in text or text.endswith(':'):
            self.error(idx, f"': ' inside a plain scalar (quote it): {text}")
        return text

    def read_quoted(self, text, pos, idx):
        """Parse the quoted scalar at text[pos]; returns (value, end position)."""
        quote = text[pos]
        out = []
        i = pos + 1
        while i < len(text):
            ch = text[i]
            if quote == "'":
                if ch == "'":
                    if i + 1 < len(text) and text[i + 1] == "'":
                        out.append("'")
                        i += 2
                        continue
                    return ''.join(out), i + 1
                out.append(ch)
            else:
                if ch == '"':
                    return ''.join(out), i + 1
                if ch == '\\':
                    i += 1
                    if i >= len(text):
                        break
                    esc = text[i]
                    if esc in _DQ_ESCAPES:
                        out.append(_DQ_ESCAPES[esc])
                    elif esc in 'xuU':
                        width = {'x': 2, 'u': 4, 'U': 8}[esc]
                        digits = text[i + 1:i + 1 + width]
                        if not re.fullmatch(r'[0-9a-fA-F]{%d}' % width, digits):
                            self.error(idx, f'bad \\{esc} escape')
                        out.append(chr(int(digits, 16)))
                        i += width
                    else:
                        self.error(idx, f'unknown escape \\{esc}')
                else:
                    out.append(ch)
            i += 1
        self.error(idx, 'quoted scalar not closed on its line')

    def split_key(self, content, idx):
        """(key, rest) when content is 'key: rest' or 'key:', else None."""
        if content[0] in '[{':
            return None
        if content.startswith('? '):
            self.error(idx, 'complex keys are not used in the ops files')
        if content[0] in '"\'':
            key, end = self.read_quoted(content, 0, idx)
            tail = content[end:].lstrip(' ')
            if tail == ':' or tail.startswith(': '):
                return key, tail[1:].strip(' ')
            return None
        m = re.search(r':( |$)', content)
        if not m:
            return None
        key = content[:m.start()].rstrip(' ')
        if not key:
            self.error(idx, 'empty key')
        if not isinstance(self.resolve_plain(key, idx), str):
            self.error(idx, f"quote the key '{key}': it would not be read as a string")
        return key, content[m.end():].strip(' ')

    # ---- flow collections (one line) ----

    def parse_flow(self, text, idx):
        value, pos = self.flow_node(text, 0, idx)
        if text[pos:].strip(' '):
            self.error(idx, f'unexpected text after a flow collection: {text[pos:]}')
        return value

    def flow_node(self, text, pos, idx):
        pos = self.skip_spaces(text, pos)
        if pos >= len(text):
            self.error(idx, 'flow collection not closed on its line')
        ch = text[pos]
        if ch == '[':
            return self.flow_items(text, pos + 1, ']', idx)
        if ch == '{':
            return self.flow_items(text, pos + 1, '}', idx)
        if ch in '"\'':
            return self.read_quoted(text, pos, idx)
        end = pos
        while end < len(text) and text[end] not in ',]}':
            end += 1
        plain = text[pos:end].strip(' ')
        if not plain or plain == '-':
            self.error(idx, 'empty entry in a flow collection')
        return self.resolve_plain(plain, idx), end

    def flow_items(self, text, pos, close, idx):
        items = [] if close == ']' else {}
        pos = self.skip_spaces(text, pos)
        if pos < len(text) and text[pos] == close:
            return items, pos + 1
        while True:
            if close == ']':
                value, pos = self.flow_node(text, pos, idx)
                items.append(value)
            else:
                pos = self.skip_spaces(text, pos)
                colon = text.find(':', pos)
                if colon < 0:
                    self.error(idx, 'flow mapping entry without ":"')
                key = text[pos:colon].strip(' ')
                if key[:1] in ('"', "'"):
                    key = self.read_quoted(key, 0, idx)[0]
                if key in items:
                    self.error(idx, f"duplicate key '{key}'")
                items[key], pos = self.flow_node(text, colon + 1, idx)
            pos = self.skip_spaces(text, pos)
            if pos >= len(text):
                self.error(idx, 'flow collection not closed on its line')
            if text[pos] == close:
                return items, pos + 1
            if text[pos] != ',':
                self.error(idx, f"expected ',' or '{close}' in a flow collection")
            pos += 1

    @staticmethod
    def skip_spaces(text, pos):
        while pos < len(text) and text[pos] == ' ':
            pos += 1
        return pos

    # ---- block scalars ----

    def block_scalar(self, header, parent_indent, idx):
        if not re.fullmatch(r'[|>][-+]?', header):
            self.error(idx, f"block scalar header '{header}' (indentation indicators are not used)")
        folded, chomp = header[0] == '>', header[1:]
        lines = []
        block_indent = None
        while self.i < len(self.lines):
            raw = self.lines[self.i]
            if raw.strip(' ') == '':
                # Spaces past the block's indentation are content.
                lines.append(raw[block_indent:] if block_indent is not None else '')
                self.i += 1
                continue
            indent = len(raw) - len(raw.lstrip(' '))
            if block_indent is None:
                if indent <= parent_indent:
                    break
                block_indent = indent
            if indent < block_indent:
                if indent > parent_indent:
                    self.error(self.i, 'block scalar line less indented than its first line')
                break
            lines.append(raw[block_indent:])
            self.i += 1
        # Trailing blank lines belong to chomping, and to the next node's lines.
        trailing = 0
        while lines and lines[-1].strip(' ') == '':
            lines.pop()
            trailing += 1
        self.i -= trailing
        if folded:
            if any(line.startswith((' ', '\t')) for line in lines):
                self.error(idx, 'more-indented lines in a folded scalar are not used')
            text, pending = '', None
            for line in lines:
                if line == '':
                    text += '\n'
                    pending = None
                else:
                    text += (' ' if pending else '') + line
                    pending = True
        else:
            text = '\n'.join(lines)
        if not lines:
            return ''
        if chomp == '-':
            return text
        if chomp == '+':
            return text + '\n' * (1 + trailing)
        return text + '\n'

    # ---- block collections ----

    def inline_value(self, text, idx, parent_indent):
        """The value written after 'key:' or '- ' on line idx (self.i is past it)."""
        if text[0] in '|>':
            return self.block_scalar(text, parent_indent, idx)
        if text[0] in '[{':
            return self.parse_flow(text, idx)
        if text[0] in '"\'':
            value, end = self.read_quoted(text, 0, idx)
            if text[end:].strip(' '):
                self.error(idx, f'text after a quoted scalar: {text[end:]}')
            return value
        return self.resolve_plain(text, idx)

    def block_node(self, parent_indent):
        """The node on the next lines indented more than parent_indent, or None."""
        idx = self.next_content()
        if idx is None:
            return None
        indent, content = self.scan(idx)
        if indent <= parent_indent:
            return None
        if _is_seq_item(content):
            return self.sequence(indent)
        if self.split_key(content, idx) is not None:
            return self.mapping(indent)
        self.i = idx + 1
        return self.inline_value(content, idx, parent_indent)

    def mapping(self, indent):
        result = {}
        while True:
            idx = self.next_content()
            if idx is None:
                return result
            line_indent, content = self.scan(idx)
            if line_indent < indent:
                return result
            if line_indent > indent:
                self.error(idx, 'unexpected indentation')
            pair = self.split_key(content, idx)
            if pair is None:
                self.error(idx, "expected 'key: value'")
            key, rest = pair
            if key in result:
                self.error(idx, f"duplicate key '{key}'")
            self.i = idx + 1
            if rest:
                result[key] = self.inline_value(rest, idx, indent)
                continue
            nxt = self.next_content()
            if nxt is not None and self.scan(nxt)[0] == indent and _is_seq_item(self.scan(nxt)[1]):
                result[key] = self.sequence(indent)
            else:
                result[key] = self.block_node(indent)

    def sequence(self, indent):
        items = []
        while True:
            idx = self.next_content()
            if idx is None:
                return items
            line_indent, content = self.scan(idx)
            if line_indent < indent or (line_indent == indent and not _is_seq_item(content)):
                return items
            if line_indent > indent:
                self.error(idx, 'unexpected indentation')
            rest = content[1:].lstrip(' ')
            if not rest:
                self.i = idx + 1
                items.append(self.block_node(indent))
                continue
            if _is_seq_item(rest) or self.split_key(rest, idx) is not None:
                # A collection starting on the dash's line: read the line again
                # with the item's content at its own column.
                body = self.lines[idx].lstrip(' ')[1:]
                column = line_indent + 1 + len(body) - len(body.lstrip(' '))
                self.lines[idx] = ' ' * column + body.lstrip(' ')
                self.i = idx
                items.append(self.sequence(column) if _is_seq_item(rest) else self.mapping(column))
                continue
            self.i = idx + 1
            items.append(self.inline_value(rest, idx, indent))

    def document(self):
        idx = self.next_content()
        if idx is None:
            return None
        indent, content = self.scan(idx)
        if indent != 0:
            self.error(idx, 'a document starts at column 0')
        value = self.block_node(-1)
        left = self.next_content()
        if left is not None:
            self.error(left, 'unexpected text after the document')
        return value


def load_yaml(path):
    """All documents of a YAML file, as Python values. Raises YamlError."""
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    docs, start = [], 0
    for i in range(len(lines) + 1):
        if i == len(lines) or re.fullmatch(r'---( #.*)?', lines[i]):
            chunk = lines[start:i]
            if any(line.strip() and not line.lstrip().startswith('#') for line in chunk):
                docs.append(_YamlParser(path, chunk, start).document())
            elif start > 0:
                raise YamlError(f'{path}:{start}: empty document after "---"')
            start = i + 1
    return docs


# ==== Results ==================================================================

class Checks:
    def __init__(self, root):
        self.root = root
        self.failures = []
        self.passed = 0

    def path(self, rel):
        return os.path.join(self.root, rel)

    def check(self, ok, where, msg):
        if ok:
            self.passed += 1
        else:
            self.failures.append(f'{where}: {msg}')
        return ok


def read(c, rel):
    with open(c.path(rel), encoding='utf-8') as f:
        return f.read()


def dig(obj, *keys):
    """obj[k0][k1]... or None where a step is missing."""
    for k in keys:
        if isinstance(obj, dict):
            obj = obj.get(k)
        elif isinstance(obj, list) and isinstance(k, int) and -len(obj) <= k < len(obj):
            obj = obj[k]
        else:
            return None
    return obj


def check_drain_grace(c, rel, pod, container, prod):
    """A pod stopped by SIGTERM drains (worker and gateway alike): its work gets
    drain.grace_ms to end, after any preStop sleep, before the SIGKILL."""
    prestop = dig(container, 'lifecycle', 'preStop', 'exec', 'command') or []
    prestop_s = int(prestop[1]) if len(prestop) == 2 and prestop[0] == 'sleep' else 0
    grace = pod.get('terminationGracePeriodSeconds', 30)
    drain_s = prod['drain']['grace_ms'] / 1000
    c.check(grace > drain_s + prestop_s, rel,
            f'terminationGracePeriodSeconds {grace} must exceed preStop {prestop_s} s + '
            f'drain.grace_ms {drain_s:g} s (config/production.example.json)')


def duration_s(text):
    """'45s', '10m', '1h30m' -> seconds, or None."""
    if not isinstance(text, str) or not re.fullmatch(r'([0-9]+(ms|s|m|h))+', text):
        return None
    scale = {'ms': 0.001, 's': 1, 'm': 60, 'h': 3600}
    return sum(int(n) * scale[u] for n, u in re.findall(r'([0-9]+)(ms|s|m|h)', text))


def quantity_bytes(text):
    """A Kubernetes quantity ('64Mi', '4Gi', '1G', '512') -> bytes, or None."""
    m = re.fullmatch(r'([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?', str(text or ''))
    if not m:
        return None
    scale = {None: 1, 'Ki': 1 << 10, 'Mi': 1 << 20, 'Gi': 1 << 30, 'Ti': 1 << 40,
             'k': 10**3, 'M': 10**6, 'G': 10**9, 'T': 10**12}
    return int(m.group(1)) * scale[m.group(2)]


def covers(mount_path, path):
    """Whether a mount at mount_path holds path."""
    mount_path = mount_path.rstrip('/')
    return path == mount_path or path.startswith(mount_path + '/')


# ==== Inputs shared by the checks ==============================================

def load_inputs(c):
    """Parses every file once; a file that does not parse is a failure and
    its checks are skipped (returns None for it)."""
    files = {}
    for rel in ('config/production.example.json', 'config/local.json',
                'ops/grafana/mllama-worker.json'):
        try:
            files[rel] = json.loads(read(c, rel))
            c.check(True, rel, '')
        except (OSError, ValueError) as e:
            c.check(False, rel, f'not valid JSON: {e}')
            files[rel] = None
    yaml_files = ['ops/compose.yaml'] + sorted(
        'ops/k8s/' + n for n in os.listdir(c.path('ops/k8s')) if n.endswith('.yaml'))
    try:
        import yaml as pyyaml
    except ImportError:
        pyyaml = None
    for rel in yaml_files:
        try:
            files[rel] = load_yaml(c.path(rel))
            c.check(True, rel, '')
        except (OSError, YamlError) as e:
            c.check(False, rel, str(e))
            files[rel] = None
            continue
        if pyyaml is not None:
            with open(c.path(rel), encoding='utf-8') as f:
                reference = list(pyyaml.safe_load_all(f))
            c.check(reference == files[rel], rel,
                    'the subset parser and PyYAML read this file differently')
    return files


def parse_metrics_md(c):
    """{name: (type, labels)} of the worker's series and the set of external
    series, from the tables of ops/metrics.md."""
    own, external, section = {}, set(), None
    for line in read(c, 'ops/metrics.md').split('\n'):
        if line.startswith('## '):
            section = line[3:].strip()
            continue
        m = re.match(r'\| `([a-z_:][a-z0-9_:]*)` \| ([^|]*)\| ([^|]*)\|', line)
        if not m:
            continue
        if section in ('Series', 'Gateway series'):
            labels = set(re.findall(r'`([a-z_]+)`', m.group(3)))
            own[m.group(1)] = (m.group(2).strip(), labels)
        elif section and section.startswith('External series'):
            external.add(m.group(1))
    c.check(len(own) >= 20, 'ops/metrics.md', f'expected the series table, found {len(own)} rows')
    for name in GATEWAY_SERIES:
        c.check(name in own, 'ops/metrics.md', f'the gateway series {name} is not listed')
    return own, external


def parse_topics_script(c):
    """{topic: partitions} from the create lines of ops/compose/create-topics.sh."""
    text = read(c, 'ops/compose/create-topics.sh')
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r'^create ([A-Za-z0-9._-]+) ([0-9]+)', text, re.M)}


def runbook_anchors(c):
    """GitHub anchors of every heading of ops/RUNBOOK.md, and the alert headings."""
    anchors, alerts, in_alerts = set(), set(), False
    for line in read(c, 'ops/RUNBOOK.md').split('\n'):
        m = re.match(r'(#+) (.*)', line)
        if not m:
            continue
        title = m.group(2).strip()
        anchor = re.sub(r'[^\w\- ]', '', title.lower()).replace(' ', '-')
        anchors.add(anchor)
        if len(m.group(1)) == 2:
            in_alerts = title == 'Alerts'
        elif len(m.group(1)) == 3 and in_alerts:
            alerts.add(title)
    return anchors, alerts


# ==== PromQL used by the alerts and the dashboard ==============================

def check_promql(c, where, expr, own, external):
    """Balanced brackets, every series documented, rate()/increase() only on
    counters and histogram parts, histogram_quantile() only on buckets."""
    depth = []
    for ch in re.sub(r'"(\\.|[^"\\])*"', '""', expr):
        if ch in '([{':
            depth.append(ch)
        elif ch in ')]}':
            if not depth or '([{'[')]}'.index(ch)] != depth.pop():
                c.check(False, where, f'unbalanced brackets in {expr!r}')
                return
    c.check(not depth, where, f'unclosed bracket in {expr!r}')
    for name in re.findall(r'\b((?:mllama|kube)_[a-z0-9_]+)\b', expr):
        base = re.sub(r'_(bucket|sum|count)$', '', name)
        if name.startswith('kube_'):
            c.check(name in external, where, f'{name} is not listed in ops/metrics.md')
        else:
            c.check(name in own or (base in own and own[base][0] == 'H'), where,
                    f'{name} is not listed in ops/metrics.md')
    for fn, name in re.findall(r'\b(rate|increase|irate)\(\s*(mllama_[a-z0-9_]+)', expr):
        base = re.sub(r'_(bucket|sum|count)$', '', name)
        ok = (name in own and own[name][0] == 'C') or (base in own and own[base][0] == 'H')
        c.check(ok, where, f'{fn}() of {name}, which is not a counter')
    for name in re.findall(r'histogram_quantile\([^,]+,[^()]*\([^()]*\(\s*([a-z0-9_]+)', expr):
        c.check(name.endswith('_bucket'), where, f'histogram_quantile of {name}, not a _bucket series')


# ==== ops/Dockerfile ===========================================================

def dockerfile_stages(c):
    """([(instruction, arguments)] before the first FROM, [(stage name, base,
    [(instruction, arguments)])]) with continuations joined."""
    preamble, stages, logical, current = [], [], [], ''
    for line in read(c, 'ops/Dockerfile').split('\n'):
        if not current and (not line.strip() or line.lstrip().startswith('#')):
            continue
        if line.endswith('\\'):
            current += line[:-1] + ' '
            continue
        logical.append(current + line)
        current = ''
    for line in logical:
        instr, _, args = line.strip().partition(' ')
        instr, args = instr.upper(), ' '.join(args.split())
        if instr == 'FROM':
            m = re.fullmatch(r'(\S+)(?: AS (\S+))?', args, re.I)
            stages.append((m.group(2) if m and m.group(2) else '', m.group(1) if m else args, []))
        elif stages:
            stages[-1][2].append((instr, args))
        else:
            preamble.append((instr, args))
    return preamble, stages


def install_deps_packages(c):
    body = re.search(r'packages=\((.*?)\n\)', read(c, 'ops/install-deps.sh'), re.S)
    words = re.sub(r'#[^\n]*', '', body.group(1)).split() if body else []
    return set(words)


_FLAVORS = ('cpu', 'gpu')
# What makes the image a worker: only in the one shared stage, so that the
# flavours cannot drift apart.
_WORKER_INSTRUCTIONS = ('USER', 'WORKDIR', 'EXPOSE', 'HEALTHCHECK', 'ENTRYPOINT', 'CMD')


def image_release(base):
    """The distribution release (and CUDA version) of an image reference:
    'nvidia/cuda:${V}-devel-ubuntu24.04' and '...-runtime-ubuntu24.04' give
    the same, as do 'debian:12' and 'debian:12-slim'."""
    repo, _, tag = base.partition(':')
    return repo, re.sub(r'-slim$', '', re.sub(r'-(devel|runtime)-', '-', tag))


def exec_form(text):
    """The JSON array of an exec-form instruction's arguments, or None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def check_dockerfile(c, http_port):
    """One recipe, two flavours: ARG FLAVOR picks build-<flavour> (under the
    alias `build`) and runtime-<flavour>; the last stage, `worker`, holds
    everything the flavours share."""
    where = 'ops/Dockerfile'
    preamble, stage_list = dockerfile_stages(c)
    names = [name for name, _, _ in stage_list]
    stages = {name: (base, instrs) for name, base, instrs in stage_list}
    required = [f'{kind}-{f}' for kind in ('build', 'runtime') for f in _FLAVORS] + ['build', 'worker']
    for name in required:
        c.check(name in stages, where, f'no stage {name}')
    if not all(n in stages for n in required):
        return
    c.check(len(names) == len(set(names)), where, f'duplicate stage names in {names}')

    # The flavour is chosen by a build argument, cpu unless told otherwise.
    global_args = dict(a.partition('=')[::2] for i, a in preamble if i == 'ARG')
    c.check(global_args.get('FLAVOR') == 'cpu', where, 'ARG FLAVOR=cpu before the first FROM')
    for name, base, _ in stage_list:
        for var in re.findall(r'\$\{?(\w+)', base):
            c.check(var in global_args, where, f'{name}: FROM uses ${var}, not an ARG before the first FROM')
    c.check(stages['build'][0] == 'build-${FLAVOR}' and not stages['build'][1], where,
            'the stage build is only FROM build-${FLAVOR} (the alias COPY --from needs)')
    c.check(stages['worker'][0] == 'runtime-${FLAVOR}', where, 'the stage worker is FROM runtime-${FLAVOR}')
    c.check(names[-1] == 'worker', where, 'worker is the last stage: the image built without --target')

    # Build stages: the packages CI uses, the flavour's backend, the runtime
    # package list the worker stage installs.
    build_runs = ' '.join(a for i, a in stages['build-cpu'][1] if i == 'RUN')
    c.check('install-deps.sh' in build_runs, where, 'the CPU build stage must use ops/install-deps.sh')
    gpu_apt = ' '.join(a for i, a in stages['build-gpu'][1] if i == 'RUN' and 'apt-get install' in a)
    gpu_pkgs = set(gpu_apt.partition('--no-install-recommends')[2].partition('&&')[0].split())
    known = install_deps_packages(c)
    c.check(gpu_pkgs and gpu_pkgs <= known, where,
            f'GPU build packages not in ops/install-deps.sh: {sorted(gpu_pkgs - known)}')
    for f in _FLAVORS:
        runs = ' '.join(a for i, a in stages[f'build-{f}'][1] if i == 'RUN')
        cuda = 'ON' if f == 'gpu' else 'OFF'
        c.check(f'-DMLLAMA_CUDA={cuda}' in runs, where, f'build-{f}: configures with -DMLLAMA_CUDA={cuda}')
        c.check(re.search(r'runtime-packages\.sh \S+ > /opt/mllama/build/runtime-packages', runs), where,
                f'build-{f}: writes /opt/mllama/build/runtime-packages with ops/runtime-packages.sh')

    # Runtime bases: the runtime image of their build stage's release, and
    # nothing of the worker (that lives once, in the worker stage).
    c.check(stages['runtime-gpu'][0].startswith('nvidia/cuda:') and 'runtime' in stages['runtime-gpu'][0],
            where, 'the gpu flavour runs on an nvidia/cuda runtime image')
    for f in _FLAVORS:
        build_base, runtime_base = stages[f'build-{f}'][0], stages[f'runtime-{f}'][0]
        c.check(image_release(build_base) == image_release(runtime_base), where,
                f'runtime-{f} ({runtime_base}) is not the release build-{f} ({build_base}) links against')
        for instr, args in stages[f'runtime-{f}'][1]:
            c.check(instr not in _WORKER_INSTRUCTIONS and '--from=' not in args, where,
                    f'runtime-{f}: {instr} belongs in the shared worker stage')

    # The worker stage.
    worker = stages['worker'][1]
    instrs = dict(worker)
    user = instrs.get('USER', '')
    c.check(user and user.split(':')[0] not in ('0', 'root'), where, 'worker: USER must be non-root')
    health = instrs.get('HEALTHCHECK', '')
    c.check(health and 'NONE' not in health.upper(), where, 'worker: no HEALTHCHECK')
    probe = re.search(r'\bCMD (\[.*\])$', health)
    c.check(probe and (exec_form(probe.group(1)) or [])[:2] == ['mllama', 'healthcheck'], where,
            'worker: HEALTHCHECK must run ["mllama", "healthcheck", ...] (no curl in the image)')
    c.check(f'127.0.0.1:{http_port}/healthz' in health, where,
            f'worker: HEALTHCHECK must probe /healthz on port {http_port}')
    c.check(str(http_port) in instrs.get('EXPOSE', '').split(), where, f'worker: EXPOSE {http_port}')
    c.check(exec_form(instrs.get('ENTRYPOINT', '')) == ['mllama', 'worker'], where,
            'worker: ENTRYPOINT ["mllama", "worker"]')
    c.check(exec_form(instrs.get('CMD', '')) == ['--config', '/etc/mllama/config.json'],
            where, 'worker: CMD ["--config", "/etc/mllama/config.json"]')
    c.check('WORKDIR' in instrs, where, 'worker: no WORKDIR')
    c.check(any(i == 'RUN' and 'runtime-packages' in a for i, a in worker), where,
            "worker: installs the build stage's runtime-packages")
    for instr, args in worker:
        source = re.search(r'--from=(\S+)', args)
        c.check(instr not in ('COPY', 'ADD') or (source and source.group(1) == 'build'), where,
                f'worker: copies only from the stage build, the chosen flavour: {instr} {args}')
    for name, (_, stage_instrs) in stages.items():
        for instr, args in stage_instrs:
            if instr in ('COPY', 'ADD'):
                c.check(not re.search(r'models|safetensors|\.bin\b', args), where,
                        f'{name}: models are mounted, never copied: {instr} {args}')
                c.check(instr == 'COPY', where, f'{name}: ADD fetches or unpacks; use COPY')

    # Files copied from the context must survive ops/Dockerfile.dockerignore,
    # which excludes everything it does not name.
    allowed = re.findall(r'^!(\S+?)/?$', read(c, 'ops/Dockerfile.dockerignore'), re.M)
    for _, (_, stage_instrs) in stages.items():
        for instr, args in stage_instrs:
            sources = []
            if instr == 'COPY' and '--from=' not in args and args.split()[0] != '.':
                sources.append(args.split()[0])
            if instr == 'RUN':  # sources used from the copied tree
                sources += [p for p in re.findall(r'/opt/mllama/([\w.-]+(?:/[\w.-]+)*)', args)
                            if not p.startswith('build')]
            for source in sources:
                c.check(any(source == a or source.startswith(a + '/') for a in allowed), where,
                        f'{source}: excluded from the build context by ops/Dockerfile.dockerignore')


# ==== ops/compose.yaml =========================================================

def check_compose(c, compose, local, topics):
    where = 'ops/compose.yaml'
    services = dig(compose, 'services') or {}
    for name in ('kafka', 'topics', 'redis', 'model', 'worker', 'client'):
        c.check(name in services, where, f'no service {name}')
    builds = {}
    for name, svc in services.items():
        if 'build' in svc:
            b = svc['build']
            c.check(b.get('dockerfile') == 'ops/Dockerfile' and 'target' not in b and
                    dig(b, 'args', 'FLAVOR') == 'cpu', where,
                    f'{name}: builds ops/Dockerfile with args FLAVOR: cpu (the whole image, no target)')
            c.check(os.path.normpath(os.path.join(c.path('ops'), b.get('context', ''))) ==
                    os.path.normpath(c.root), where, f'{name}: the build context is the repository root')
            builds.setdefault(svc.get('image'), []).append(json.dumps(b, sort_keys=True))
        for dep, cond in (svc.get('depends_on') or {}).items():
            condition = cond.get('condition')
            c.check(dep in services, where, f'{name} depends on unknown service {dep}')
            c.check(condition in ('service_started', 'service_healthy', 'service_completed_successfully'),
                    where, f'{name}: depends_on {dep} condition {condition}')
            if condition == 'service_healthy' and dep in services:
                c.check(dig(services[dep], 'healthcheck', 'test') is not None, where,
                        f'{name} waits for {dep} to be healthy, but {dep} has no healthcheck')
        for vol in svc.get('volumes') or []:
            source = vol.split(':')[0]
            if source.startswith('.'):
                c.check(os.path.exists(os.path.join(c.path('ops'), source)), where,
                        f'{name}: bind mount source {source} does not exist')
    for image, variants in builds.items():
        c.check(len(set(variants)) == 1, where, f'services tagging {image} build it differently')
    worker = services.get('worker') or {}
    env = worker.get('environment') or {}
    kafka_env = dig(services, 'kafka', 'environment') or {}
    c.check(f"PLAINTEXT://{env.get('MLLAMA_KAFKA_BROKERS')}" in
            str(kafka_env.get('KAFKA_ADVERTISED_LISTENERS', '')).split(','), where,
            'MLLAMA_KAFKA_BROKERS must be the broker\'s advertised PLAINTEXT listener')
    redis_url = str(env.get('MLLAMA_REDIS_URL', ''))
    c.check(re.match(r'redis://mllama-worker:[^@]+@redis:', redis_url) is not None, where,
            'MLLAMA_REDIS_URL must point at the redis service as the mllama-worker ACL user')
    conf = read(c, 'ops/redis/redis.conf')
    policy = re.search(r'^maxmemory-policy\s+(\S+)', conf, re.M)
    c.check(re.search(r'^maxmemory\s+\S+', conf, re.M) is not None and policy is not None and
            policy.group(1).startswith('volatile-'), 'ops/redis/redis.conf',
            'maxmemory and a volatile-* maxmemory-policy (never noeviction: a full Redis '
            'refuses INCR and the poison guard is off; never allkeys-*: adapters have no TTL)')
    c.check('models:/models:ro' in (worker.get('volumes') or []), where,
            'workers mount the model volume read-only at /models')
    c.check('../config/local.json:/etc/mllama/config.json:ro' in (worker.get('volumes') or []), where,
            'workers read config/local.json at /etc/mllama/config.json')
    adapters_dir = str(env.get('MLLAMA_MODEL_ADAPTERS_DIR', dig(local, 'model', 'adapters_dir') or ''))
    writable = [t.split(':')[0] for t in worker.get('tmpfs') or []] + [
        v.split(':')[1] for v in worker.get('volumes') or []
        if len(v.split(':')) >= 2 and not v.endswith(':ro')]
    c.check(adapters_dir.startswith('/') and any(covers(m, adapters_dir) for m in writable), where,
            f'the worker\'s model.adapters_dir ({adapters_dir}) must be an absolute path on a '
            'tmpfs or a writable volume: the image\'s own directories are not writable by its user')
    grace = duration_s(worker.get('stop_grace_period'))
    drain_s = dig(local, 'drain', 'grace_ms') / 1000 if dig(local, 'drain', 'grace_ms') else None
    c.check(grace is not None and drain_s is not None and grace > drain_s, where,
            f'worker stop_grace_period ({worker.get("stop_grace_period")}) must exceed '
            f'drain.grace_ms of config/local.json ({drain_s} s)')
    client_sh = read(c, 'ops/compose/client.sh')
    sample = re.search(r'IMAGE:-/samples/([^}]+)\}', client_sh)
    c.check(sample and os.path.isfile(c.path('config/samples/' + sample.group(1))), 'ops/compose/client.sh',
            'the default sample image must exist in config/samples')
    c.check('mllama submit' in client_sh, 'ops/compose/client.sh', 'the client runs `mllama submit`')
    c.check('docker compose -f ops/compose.yaml up --build' in read(c, 'ops/compose.yaml'), where,
            'the file says how to run it')
    c.check(topics.get('mllama.replies', 0) > 0, 'ops/compose/create-topics.sh', 'no reply topic mllama.replies')


def check_compose_gateway(c, compose, local, prod):
    """The compose stack's gateway against its workers, its topic and the config."""
    where = 'ops/compose.yaml'
    services = dig(compose, 'services') or {}
    gateway = services.get('gateway')
    if not c.check(isinstance(gateway, dict), where, 'no service gateway'):
        return
    env = gateway.get('environment') or {}
    worker_env = dig(services, 'worker', 'environment') or {}
    c.check(gateway.get('entrypoint') == ['mllama', 'gateway'], where, 'gateway: entrypoint ["mllama", "gateway"]')
    c.check(env.get('MLLAMA_KAFKA_BROKERS') == worker_env.get('MLLAMA_KAFKA_BROKERS'), where,
            'gateway: the workers\' MLLAMA_KAFKA_BROKERS')
    c.check(dig(gateway, 'depends_on', 'topics', 'condition') == 'service_completed_successfully', where,
            'gateway: waits for the topics (its reply topic among them)')
    # A container's hostname changes when it is recreated: the instance, and
    # so the reply topic, is named. The topic exists before the gateway
    # starts (the topics service names the same instance) or the gateway
    # creates it.
    instance = env.get('MLLAMA_GATEWAY_INSTANCE')
    gateways = str(dig(services, 'topics', 'environment', 'GATEWAYS') or '').split()
    creates = str(env.get('MLLAMA_GATEWAY_CREATE_REPLY_TOPICS', gateway_config(local)['create_reply_topics']))
    c.check(isinstance(instance, str) and instance != '', where, 'gateway: a fixed MLLAMA_GATEWAY_INSTANCE')
    c.check(instance in gateways or creates.lower() == 'true', where,
            'gateway: its reply topic is created neither by the topics service (GATEWAYS) nor by it')
    published = [str(p) for p in gateway.get('ports') or []]
    listen = env.get('MLLAMA_GATEWAY_LISTEN', gateway_config(local)['listen'])
    http_listen = env.get('MLLAMA_HTTP_LISTEN', local['http']['listen'])
    c.check(str(listen).startswith('0.0.0.0:') and str(http_listen).startswith('0.0.0.0:'), where,
            'gateway: both listeners on 0.0.0.0 inside the container')
    for port in (listen_port(listen), listen_port(http_listen)):
        c.check(any(p.startswith('127.0.0.1:') and p.endswith(f':{port}') for p in published), where,
                f'gateway: container port {port} published on 127.0.0.1')
    grace = duration_s(gateway.get('stop_grace_period'))
    drain_s = dig(local, 'drain', 'grace_ms') / 1000 if dig(local, 'drain', 'grace_ms') else None
    c.check(grace is not None and drain_s is not None and grace > drain_s, where,
            f'gateway stop_grace_period ({gateway.get("stop_grace_period")}) must exceed '
            f'drain.grace_ms of config/local.json ({drain_s} s): SIGTERM drains it')
    health = dig(gateway, 'healthcheck', 'test') or []
    c.check(health[:2] == ['CMD', 'mllama'] and f':{listen_port(http_listen)}/readyz' in ' '.join(health),
            where, 'gateway: healthcheck probes /readyz on http.listen')
    c.check('../config/local.json:/etc/mllama/config.json:ro' in (gateway.get('volumes') or []) and
            gateway.get('command') == ['--config', '/etc/mllama/config.json'], where,
            'gateway: reads config/local.json, as the workers')
    script = read(c, 'ops/compose/create-topics.sh')
    partitions = re.search(r'^gateway_reply_partitions=([0-9]+)$', script, re.M)
    c.check(partitions is not None and int(partitions.group(1)) == gateway_config(prod)['reply_partitions'],
            'ops/compose/create-topics.sh', 'gateway_reply_partitions must equal gateway.reply_partitions')
    c.check('create "$1.gw-$2"' in script and 'gateway_reply mllama.replies "$g"' in script and
            'gateway_reply "mllama.replies.$t" "$g"' in script, 'ops/compose/create-topics.sh',
            'gateway reply topics are <tenant reply topic>.gw-<instance>')


# ==== ops/k8s ==================================================================

def check_k8s(c, files, prod, topics, own, external):
    objects = {}  # the workers': kind -> (file, object)
    gateway = []  # the gateway's (objects named mllama-gateway*): [(file, object)]
    for rel, docs in files.items():
        if not rel.startswith('ops/k8s/') or docs is None or rel.endswith('kustomization.yaml'):
            continue
        for doc in docs:
            for key in ('apiVersion', 'kind'):
                c.check(isinstance(dig(doc, key), str), rel, f'no {key}')
            c.check(isinstance(dig(doc, 'metadata', 'name'), str), rel, 'no metadata.name')
            if str(dig(doc, 'metadata', 'name')).startswith('mllama-gateway'):
                gateway.append((rel, doc))
            else:
                c.check(dig(doc, 'kind') not in objects, rel, f'a second worker {dig(doc, "kind")}')
                objects[dig(doc, 'kind')] = (rel, doc)
    check_k8s_gateway(c, files, gateway, prod, own)
    for kind in ('Deployment', 'Service', 'PodDisruptionBudget', 'ScaledObject', 'PodMonitor', 'PrometheusRule',
                 'NetworkPolicy'):
        c.check(kind in objects, 'ops/k8s', f'no {kind}')
    if 'Deployment' not in objects:
        return
    rel, deploy = objects['Deployment']
    name = dig(deploy, 'metadata', 'name')
    pod_labels = dig(deploy, 'spec', 'template', 'metadata', 'labels') or {}
    pod = dig(deploy, 'spec', 'template', 'spec') or {}
    container = dig(pod, 'containers', 0) or {}
    http_port = int(prod['http']['listen'].rsplit(':', 1)[1])
    ports = {p.get('name'): p.get('containerPort') for p in container.get('ports') or []}
    c.check(ports.get('http') == http_port, rel, f'container port "http" must be {http_port} (http.listen)')
    c.check(set((dig(deploy, 'spec', 'selector', 'matchLabels') or {}).items()) <= set(pod_labels.items()),
            rel, 'the selector does not match the pod labels')
    c.check('replicas' not in deploy['spec'], rel, 'KEDA owns spec.replicas; leave it out')
    probes = {}
    for probe in ('startupProbe', 'livenessProbe', 'readinessProbe'):
        p = container.get(probe)
        if c.check(isinstance(p, dict), rel, f'no {probe}'):
            probes[probe] = dig(p, 'httpGet', 'path')
            c.check(dig(p, 'httpGet', 'port') in ('http', http_port), rel, f'{probe} probes another port')
    c.check(probes.get('startupProbe') == '/healthz' and probes.get('livenessProbe') == '/healthz', rel,
            'startup and liveness probes use /healthz')
    c.check(probes.get('readinessProbe') == '/readyz', rel, 'the readiness probe uses /readyz')
    startup = container.get('startupProbe') or {}
    c.check(startup.get('periodSeconds', 10) * startup.get('failureThreshold', 3) >= 300, rel,
            'the startup probe must allow at least 5 minutes of model load')
    check_drain_grace(c, rel, pod, container, prod)
    c.check(dig(container, 'resources', 'limits', 'nvidia.com/gpu') == 1, rel, 'limits nvidia.com/gpu: 1')
    c.check(pod.get('nodeSelector') or pod.get('affinity'), rel, 'GPU workers need a node selector')
    c.check(any(t.get('key') == 'nvidia.com/gpu' for t in pod.get('tolerations') or []), rel,
            'no toleration for the nvidia.com/gpu taint')
    c.check(dig(pod, 'securityContext', 'runAsNonRoot') is True and
            dig(pod, 'securityContext', 'runAsUser') not in (None, 0), rel, 'pods run as non-root')
    c.check(dig(container, 'securityContext', 'readOnlyRootFilesystem') is True, rel,
            'readOnlyRootFilesystem: true')
    c.check(dig(container, 'securityContext', 'allowPrivilegeEscalation') is False, rel,
            'allowPrivilegeEscalation: false')
    mounts = {m.get('mountPath'): m for m in container.get('volumeMounts') or []}
    c.check(dig(mounts, '/models', 'readOnly') is True, rel, 'models mounted read-only at /models')
    c.check('/etc/mllama' in mounts, rel, 'the config is mounted at /etc/mllama')
    config_volume = dig(mounts, '/etc/mllama', 'name')
    volumes = {v.get('name'): v for v in pod.get('volumes') or []}
    config_map = dig(volumes, config_volume, 'configMap', 'name')
    c.check(config_map is not None, rel, 'the /etc/mllama volume is a ConfigMap')
    # Adapters from Redis are copied into model.adapters_dir: with a read-only
    # root filesystem it must be a writable volume, bounded, with room for one
    # adapter at limits.max_adapter_bytes at least.
    adapters_dir = dig(prod, 'model', 'adapters_dir') or ''
    holders = [m for p, m in mounts.items() if isinstance(p, str) and covers(p, adapters_dir)]
    holder = max(holders, key=lambda m: len(m.get('mountPath')), default={})
    volume = volumes.get(holder.get('name')) or {}
    c.check(bool(holder) and holder.get('readOnly') is not True and
            ('emptyDir' in volume or 'persistentVolumeClaim' in volume), rel,
            f'model.adapters_dir ({adapters_dir}) must be on a writable volume (an emptyDir): '
            'adapters published in Redis are copied there and the root filesystem is read-only')
    if 'emptyDir' in volume:
        size = quantity_bytes(dig(volume, 'emptyDir', 'sizeLimit'))
        # The copies stay under limits.adapters_dir_bytes, and one more may
        # be staged while they are at it (service/worker/adapter_store.h).
        max_adapter = dig(prod, 'limits', 'max_adapter_bytes') or 0
        dir_bytes = dig(prod, 'limits', 'adapters_dir_bytes') or 0
        c.check(size is not None and size >= dir_bytes + max_adapter, rel,
                f'the {holder.get("name")} emptyDir needs a sizeLimit of at least '
                f'limits.adapters_dir_bytes + limits.max_adapter_bytes ({dir_bytes + max_adapter})')
    c.check(prod['model']['dir'].startswith('/models/'), 'config/production.example.json',
            'model.dir must be inside the /models mount')

    kust = (files.get('ops/k8s/kustomization.yaml') or [None])[0] or {}
    # Directories are other kustomizations (../redis/k8s), checked as files.
    resources = {r for r in kust.get('resources') or [] if r.endswith('.yaml')}
    for r in kust.get('resources') or []:
        if not r.endswith('.yaml'):
            c.check(os.path.exists(os.path.join(c.path('ops/k8s'), r, 'kustomization.yaml')),
                    'ops/k8s/kustomization.yaml', f'resource {r} is not a kustomization')
    yaml_files = {os.path.basename(r) for r in files if r.startswith('ops/k8s/')} - {'kustomization.yaml'}
    c.check(resources == yaml_files, 'ops/k8s/kustomization.yaml',
            f'resources must list every manifest: missing {sorted(yaml_files - resources)}, '
            f'unknown {sorted(resources - yaml_files)}')
    generated = {g.get('name'): g.get('files') for g in kust.get('configMapGenerator') or []}
    c.check(config_map in generated, 'ops/k8s/kustomization.yaml', f'no configMapGenerator for {config_map}')
    c.check(['config.json=../../config/production.example.json'] == generated.get(config_map),
            'ops/k8s/kustomization.yaml', 'the ConfigMap is generated from config/production.example.json')

    for kind in ('Service', 'PodDisruptionBudget', 'PodMonitor'):
        if kind not in objects:
            continue
        r, obj = objects[kind]
        selector = dig(obj, 'spec', 'selector')
        selector = selector.get('matchLabels', selector) if isinstance(selector, dict) else {}
        c.check(selector and set(selector.items()) <= set(pod_labels.items()), r,
                f'{kind} selector does not select the worker pods')
    if 'NetworkPolicy' in objects:
        r, policy = objects['NetworkPolicy']
        spec = policy.get('spec') or {}
        selector = dig(spec, 'podSelector', 'matchLabels') or {}
        c.check(selector and set(selector.items()) <= set(pod_labels.items()), r,
                'NetworkPolicy podSelector does not select the worker pods')
        # Ingress only: an Egress type would cut the workers off Kafka and Redis.
        c.check(spec.get('policyTypes') == ['Ingress'], r, 'policyTypes: [Ingress]')
        rules = spec.get('ingress') or []
        c.check(len(rules) > 0, r, 'at least one ingress rule (the scrape)')
        for i, rule in enumerate(rules):
            c.check(len(rule.get('from') or []) > 0, r, f'ingress[{i}] names its sources (no open rule)')
            ports = rule.get('ports') or []
            c.check(len(ports) > 0 and all(p.get('port') in ('http', http_port) for p in ports), r,
                    f'ingress[{i}] opens the http port only')
    if 'Service' in objects:
        r, svc = objects['Service']
        c.check(any(p.get('targetPort') in ('http', http_port) for p in dig(svc, 'spec', 'ports') or []),
                r, 'the Service exposes the http port')
    if 'PodDisruptionBudget' in objects:
        r, pdb = objects['PodDisruptionBudget']
        c.check(dig(pdb, 'spec', 'maxUnavailable') == 1, r, 'maxUnavailable: 1')
    if 'PodMonitor' in objects:
        r, pm = objects['PodMonitor']
        endpoint = dig(pm, 'spec', 'podMetricsEndpoints', 0) or {}
        c.check(endpoint.get('port') == 'http' and endpoint.get('path') == '/metrics', r,
                'scrapes /metrics on the http port')
        job = pod_labels.get(dig(pm, 'spec', 'jobLabel'))
        c.check(job == 'mllama-worker', r, 'jobLabel must give job="mllama-worker", which the alerts select')

    if 'ScaledObject' in objects:
        r, so = objects['ScaledObject']
        spec = so.get('spec') or {}
        trigger = dig(spec, 'triggers', 0) or {}
        meta = trigger.get('metadata') or {}
        kafka = prod['kafka']
        request_topic = kafka['request_topic']
        c.check(dig(spec, 'scaleTargetRef', 'name') == name, r, f'scaleTargetRef must name {name}')
        c.check(trigger.get('type') == 'kafka', r, 'the trigger is the kafka scaler')
        c.check(all(isinstance(v, str) for v in meta.values()), r, 'trigger metadata values must be strings')
        c.check(meta.get('bootstrapServers') == kafka['brokers'], r, 'bootstrapServers must equal kafka.brokers')
        c.check(meta.get('consumerGroup') == kafka['group'], r, 'consumerGroup must equal kafka.group')
        c.check(meta.get('topic') == request_topic, r, 'topic must equal kafka.request_topic')
        c.check(meta.get('offsetResetPolicy') == 'earliest', r, 'offsetResetPolicy earliest, as the worker')
        c.check(meta.get('allowIdleConsumers') == 'false', r, 'allowIdleConsumers must be "false"')
        c.check(re.fullmatch(r'[1-9][0-9]*', meta.get('lagThreshold', '')) is not None, r,
                'lagThreshold is a positive integer')
        partitions = topics.get(request_topic)
        max_replicas = spec.get('maxReplicaCount')
        c.check(partitions is not None and isinstance(max_replicas, int) and max_replicas <= partitions, r,
                f'maxReplicaCount {max_replicas} must not exceed the {partitions} partitions of '
                f'{request_topic} (ops/compose/create-topics.sh)')
        c.check(1 <= spec.get('minReplicaCount', 0) <= (max_replicas or 0), r,
                'minReplicaCount between 1 and maxReplicaCount')
        scale = read(c, 'ops/RUNBOOK.md').split('\n## Scale', 1)[-1].split('\n## ', 1)[0]
        c.check(re.search(r'\b%s\b' % meta.get('lagThreshold'), scale) is not None and
                re.search(r'\b%d\b' % prod['runtime']['max_running'], scale) is not None,
                'ops/RUNBOOK.md', 'the Scale section must show the lagThreshold arithmetic '
                'with runtime.max_running of the production config')

    if 'PrometheusRule' in objects:
        check_alerts(c, *objects['PrometheusRule'], own, external)


# The gateway section's defaults (config/README.md "gateway"); a config file's
# own `gateway` section overrides them.
GATEWAY_DEFAULTS = {'listen': '127.0.0.1:8080', 'keepalive_s': 15, 'max_streams': 4096,
                    'write_buffer_bytes': 65536, 'max_retained_bytes': 268435456,
                    'reply_partitions': 4, 'create_reply_topics': True}
# The gateway's series (ops/metrics.md "Gateway series"): what its
# ScaledObject, alerts and runbook read.
GATEWAY_SERIES = ('mllama_gateway_connections_open', 'mllama_gateway_streams_open',
                  'mllama_gateway_requests_total', 'mllama_gateway_http_errors_total',
                  'mllama_gateway_ttfb_seconds', 'mllama_gateway_resumes_total',
                  'mllama_gateway_continuations_total', 'mllama_gateway_divergences_total',
                  'mllama_gateway_abandoned_total', 'mllama_gateway_cancels_total',
                  'mllama_gateway_retained_bytes', 'mllama_gateway_image_fetches_total',
                  'mllama_gateway_image_fetches_pending')


def gateway_config(config):
    merged = dict(GATEWAY_DEFAULTS)
    merged.update(dig(config, 'gateway') or {})
    return merged


def listen_port(text):
    return int(str(text).rsplit(':', 1)[1])


def env_map(container):
    """{name: value or the valueFrom mapping} of a container's env."""
    return {e.get('name'): e.get('value', e.get('valueFrom')) for e in container.get('env') or []}


def check_k8s_gateway(c, files, gateway, prod, own):
    """The gateway's StatefulSet and its companions (ops/k8s/gateway-*.yaml)."""
    gw = gateway_config(prod)
    by_kind = {}
    for rel, obj in gateway:
        by_kind.setdefault(obj.get('kind'), []).append((rel, obj))
    for kind in ('StatefulSet', 'Service', 'Ingress', 'ScaledObject', 'PodDisruptionBudget', 'PodMonitor',
                 'NetworkPolicy'):
        c.check(kind in by_kind, 'ops/k8s', f'no gateway {kind}')
    if 'StatefulSet' not in by_kind:
        return
    rel, sts = by_kind['StatefulSet'][0]
    spec = sts.get('spec') or {}
    pod = dig(spec, 'template', 'spec') or {}
    pod_labels = dig(spec, 'template', 'metadata', 'labels') or {}
    container = dig(pod, 'containers', 0) or {}
    env = env_map(container)
    ports = {p.get('name'): p.get('containerPort') for p in container.get('ports') or []}
    api_port, ops_port = ports.get('api'), ports.get('ops')
    c.check('replicas' not in spec, rel, 'KEDA owns spec.replicas; leave it out')
    c.check(set((dig(spec, 'selector', 'matchLabels') or {}).items()) <= set(pod_labels.items()) and
            pod_labels.get('app.kubernetes.io/name') == 'mllama-gateway', rel,
            'the selector matches the pod labels, app.kubernetes.io/name: mllama-gateway')
    c.check(container.get('command') == ['mllama', 'gateway'], rel, 'command ["mllama", "gateway"]')
    # The instance name is the reply topic's suffix: a StatefulSet's stable
    # pod name, never a per-restart one.
    c.check(dig(env, 'MLLAMA_GATEWAY_INSTANCE', 'fieldRef', 'fieldPath') == 'metadata.name', rel,
            'MLLAMA_GATEWAY_INSTANCE is the pod name (fieldRef metadata.name)')
    c.check(isinstance(env.get('MLLAMA_GATEWAY_LISTEN'), str) and
            listen_port(env['MLLAMA_GATEWAY_LISTEN']) == api_port, rel,
            'MLLAMA_GATEWAY_LISTEN listens on the container port "api"')
    http_listen = env.get('MLLAMA_HTTP_LISTEN', prod['http']['listen'])
    c.check(listen_port(http_listen) == ops_port, rel, 'http.listen is the container port "ops"')
    for probe, path in (('livenessProbe', '/healthz'), ('readinessProbe', '/readyz')):
        c.check(dig(container, probe, 'httpGet', 'path') == path and
                dig(container, probe, 'httpGet', 'port') in ('ops', ops_port), rel,
                f'{probe} probes {path} on the ops port')
    c.check('nvidia.com/gpu' not in (dig(container, 'resources', 'limits') or {}), rel, 'the gateway needs no GPU')
    c.check(dig(pod, 'securityContext', 'runAsNonRoot') is True, rel, 'pods run as non-root')
    c.check(dig(container, 'securityContext', 'readOnlyRootFilesystem') is True and
            dig(container, 'securityContext', 'allowPrivilegeEscalation') is False, rel,
            'readOnlyRootFilesystem: true, allowPrivilegeEscalation: false')
    memory = quantity_bytes(dig(container, 'resources', 'limits', 'memory'))
    bound = gw['max_retained_bytes'] + gw['max_streams'] * gw['write_buffer_bytes']
    c.check(memory is not None and memory > bound, rel,
            f'the memory limit must exceed gateway.max_retained_bytes + max_streams x '
            f'write_buffer_bytes ({bound} bytes)')
    # SIGTERM drains the gateway as it drains a worker.
    check_drain_grace(c, rel, pod, container, prod)
    mounts = {m.get('mountPath'): m.get('name') for m in container.get('volumeMounts') or []}
    volumes = {v.get('name'): v for v in pod.get('volumes') or []}
    keys_file = env.get('MLLAMA_GATEWAY_API_KEYS_FILE')
    keys_volume = volumes.get(mounts.get(os.path.dirname(str(keys_file)))) or {}
    c.check(isinstance(keys_file, str) and 'secret' in keys_volume, rel,
            'gateway.api_keys_file lies in a mounted Secret directory (an update reaches the file)')
    generated = {g.get('name') for g in dig((files.get('ops/k8s/kustomization.yaml') or [None])[0],
                                            'configMapGenerator') or []}
    c.check(dig(volumes, mounts.get('/etc/mllama'), 'configMap', 'name') in generated, rel,
            'the gateway reads the generated config at /etc/mllama, as the workers')
    # The gateway reads adapter names from Redis (/v1/models) as a frontend:
    # that role's credentials and label, never the worker's.
    url_secret = dig(env.get('MLLAMA_REDIS_URL') or {}, 'secretKeyRef', 'name')
    c.check(url_secret == 'mllama-redis-frontend' and pod_labels.get('mllama.io/redis-role') == 'frontend',
            rel, 'the gateway gets the frontend Redis role: its URL from Secret mllama-redis-frontend '
                 'and the label mllama.io/redis-role: frontend')
    images = {i.get('name'): i for i in dig((files.get('ops/k8s/kustomization.yaml') or [None])[0],
                                            'images') or []}
    c.check(container.get('image') in images and
            str(images[container.get('image')].get('newTag', '')).endswith('cpu'), 'ops/k8s/kustomization.yaml',
            'the gateway image maps to the cpu flavour')

    services = {dig(o, 'metadata', 'name'): (r, o) for r, o in by_kind.get('Service', [])}
    headless = services.get(spec.get('serviceName'))
    c.check(headless is not None and dig(headless[1], 'spec', 'clusterIP') == 'None', rel,
            'serviceName names a headless gateway Service')
    for name, (r, svc) in services.items():
        selector = dig(svc, 'spec', 'selector') or {}
        c.check(selector and set(selector.items()) <= set(pod_labels.items()), r,
                f'Service {name} selects the gateway pods')
    for r, ing in by_kind.get('Ingress', []):
        backend = dig(ing, 'spec', 'rules', 0, 'http', 'paths', 0, 'backend', 'service') or {}
        api_service = (services.get(backend.get('name')) or (None, {}))[1]
        svc_ports = {p.get('name'): p for p in dig(api_service, 'spec', 'ports') or []}
        target = dig(svc_ports, dig(backend, 'port', 'name'), 'targetPort')
        c.check(target in ('api', api_port), r, 'the Ingress reaches the gateway\'s api port')
        notes = dig(ing, 'metadata', 'annotations') or {}
        prefix = 'nginx.ingress.kubernetes.io/'
        c.check(notes.get(prefix + 'proxy-buffering') == 'off', r, 'proxy buffering off (SSE)')
        read_timeout = int(notes.get(prefix + 'proxy-read-timeout', '60'))
        c.check(read_timeout > gw['keepalive_s'], r,
                f'proxy-read-timeout ({read_timeout} s) must exceed gateway.keepalive_s ({gw["keepalive_s"]} s)')
        body = quantity_bytes(str(notes.get(prefix + 'proxy-body-size', '1m')).replace('m', 'Mi'))
        c.check(body is not None and body >= prod['limits']['max_request_bytes'], r,
                'proxy-body-size must admit limits.max_request_bytes (the gateway answers 413 itself)')
    for r, so in by_kind.get('ScaledObject', []):
        so_spec = so.get('spec') or {}
        c.check(dig(so_spec, 'scaleTargetRef', 'kind') == 'StatefulSet' and
                dig(so_spec, 'scaleTargetRef', 'name') == dig(sts, 'metadata', 'name'), r,
                'scaleTargetRef names the gateway StatefulSet')
        triggers = {t.get('type'): t for t in so_spec.get('triggers') or []}
        query = str(dig(triggers, 'prometheus', 'metadata', 'query') or '')
        c.check('mllama_gateway_streams_open' in query and 'job="mllama-gateway"' in query, r,
                'a prometheus trigger on mllama_gateway_streams_open of job "mllama-gateway"')
        c.check((own.get('mllama_gateway_streams_open') or ('',))[0] == 'G', r,
                'mllama_gateway_streams_open is a gauge in ops/metrics.md')
        c.check(re.fullmatch(r'[1-9][0-9]*', str(dig(triggers, 'prometheus', 'metadata', 'threshold'))) is not None,
                r, 'threshold is a positive integer (streams per gateway)')
        c.check(1 <= so_spec.get('minReplicaCount', 0) <= so_spec.get('maxReplicaCount', 0), r,
                'minReplicaCount between 1 and maxReplicaCount')
    for kind in ('PodDisruptionBudget', 'PodMonitor', 'NetworkPolicy'):
        for r, obj in by_kind.get(kind, []):
            key = 'podSelector' if kind == 'NetworkPolicy' else 'selector'
            selector = dig(obj, 'spec', key, 'matchLabels') or {}
            c.check(selector and set(selector.items()) <= set(pod_labels.items()), r,
                    f'{kind} selects the gateway pods')
    for r, pm in by_kind.get('PodMonitor', []):
        endpoint = dig(pm, 'spec', 'podMetricsEndpoints', 0) or {}
        c.check(endpoint.get('port') == 'ops' and endpoint.get('path') == '/metrics', r,
                'scrapes /metrics on the ops port')
        c.check(pod_labels.get(dig(pm, 'spec', 'jobLabel')) == 'mllama-gateway', r,
                'jobLabel gives job="mllama-gateway", which the ScaledObject selects')
    for r, policy in by_kind.get('NetworkPolicy', []):
        c.check(dig(policy, 'spec', 'policyTypes') == ['Ingress'], r, 'policyTypes: [Ingress]')
        for i, rule in enumerate(dig(policy, 'spec', 'ingress') or []):
            c.check(len(rule.get('from') or []) > 0, r, f'ingress[{i}] names its sources')
            c.check(all(p.get('port') in ('api', 'ops') for p in rule.get('ports') or [None]), r,
                    f'ingress[{i}] opens the api or the ops port only')


def check_alerts(c, rel, rule_obj, own, external):
    anchors, runbook_alerts = runbook_anchors(c)
    names = []
    for group in dig(rule_obj, 'spec', 'groups') or []:
        for rule in group.get('rules') or []:
            alert = rule.get('alert')
            where = f'{rel}: {alert}'
            if not c.check(isinstance(alert, str) and re.fullmatch(r'Mllama[A-Za-z]+', alert), rel,
                           f'alert name {alert!r}'):
                continue
            names.append(alert)
            c.check(dig(rule, 'labels', 'severity') in ('critical', 'warning', 'info'), where, 'severity label')
            for key in ('summary', 'description', 'runbook_url'):
                c.check(isinstance(dig(rule, 'annotations', key), str), where, f'no annotation {key}')
            url = dig(rule, 'annotations', 'runbook_url') or ''
            m = re.search(r'/ops/RUNBOOK\.md#([\w-]+)$', url)
            c.check(m and m.group(1) in anchors, where, f'runbook_url {url} has no anchor in ops/RUNBOOK.md')
            c.check(alert in runbook_alerts, where, 'no section under "## Alerts" in ops/RUNBOOK.md')
            if 'for' in rule:
                c.check(duration_s(rule['for']) is not None, where, f'bad for: {rule["for"]}')
            expr = rule.get('expr')
            if c.check(isinstance(expr, str) and expr.strip(), where, 'no expr'):
                check_promql(c, where, expr, own, external)
    c.check(len(names) == len(set(names)), rel, 'duplicate alert names')
    c.check(runbook_alerts <= set(names), 'ops/RUNBOOK.md',
            f'alert sections without an alert: {sorted(runbook_alerts - set(names))}')


# ==== ops/grafana ==============================================================

def check_dashboard(c, dash, own, external):
    rel = 'ops/grafana/mllama-worker.json'
    variables = {v.get('name'): v for v in dig(dash, 'templating', 'list') or []}
    c.check(dig(variables, 'datasource', 'type') == 'datasource' and
            dig(variables, 'datasource', 'query') == 'prometheus', rel,
            'the Prometheus data source is a variable named "datasource"')
    ids, boxes = set(), []
    panels = dash.get('panels') or []
    c.check(len(panels) >= 10, rel, 'expected a full dashboard')
    for p in panels:
        title = f'{rel}: panel {p.get("title")!r}'
        c.check(p.get('id') not in ids, title, 'duplicate panel id')
        ids.add(p.get('id'))
        g = p.get('gridPos') or {}
        c.check(all(isinstance(g.get(k), int) for k in 'hwxy') and g['x'] + g['w'] <= 24, title, 'gridPos')
        if all(isinstance(g.get(k), int) for k in 'hwxy'):
            for other, og in boxes:
                overlap = (g['x'] < og['x'] + og['w'] and og['x'] < g['x'] + g['w'] and
                           g['y'] < og['y'] + og['h'] and og['y'] < g['y'] + g['h'])
                c.check(not overlap, title, f'overlaps panel {other!r}')
            boxes.append((p.get('title'), g))
        if p.get('type') == 'row':
            continue
        c.check(dig(p, 'datasource', 'uid') == '${datasource}', title, 'uses the datasource variable')
        targets = p.get('targets') or []
        c.check(targets, title, 'no query')
        for t in targets:
            expr = t.get('expr', '')
            c.check(dig(t, 'datasource', 'uid') == '${datasource}', title, 'target datasource variable')
            for var in re.findall(r'\$(?!__)(\w+)', expr):
                c.check(var in variables, title, f'unknown variable ${var}')
            check_promql(c, title, expr, own, external)


# ==== Scripts and docs =========================================================

def check_scripts_and_docs(c, files):
    for rel in ('ops/compose/create-topics.sh', 'ops/compose/client.sh', 'ops/runtime-packages.sh'):
        run = subprocess.run(['sh', '-n', c.path(rel)], capture_output=True, text=True)
        c.check(run.returncode == 0, rel, f'sh -n: {run.stderr.strip()}')
    run = subprocess.run(['bash', '-n', c.path('ops/demo.sh')], capture_output=True, text=True)
    c.check(run.returncode == 0, 'ops/demo.sh', f'bash -n: {run.stderr.strip()}')
    demo = read(c, 'ops/demo.sh')
    c.check('"$bin" gateway' in demo and '--set gateway.listen=' in demo, 'ops/demo.sh',
            'the demo starts the gateway (mllama gateway --set gateway.listen=...)')
    runbook = read(c, 'ops/RUNBOOK.md')
    for section in ('Quick start (compose)', 'Deploy (Kubernetes)', 'Scale', 'Drain',
                    'Upgrade the worker image', 'Upgrade the model', 'Rotate adapters',
                    'Read the dashboard', 'Gateway', 'Alerts'):
        c.check(f'\n## {section}\n' in runbook, 'ops/RUNBOOK.md', f'no section "## {section}"')
    gateway = runbook.split('\n## Gateway\n', 1)[-1].split('\n## ', 1)[0]
    for needle in ('mllama gateway --new-key', 'SIGHUP', 'gateway.api_keys_file', '--operation Write',
                   '--operation Read', '--operation Create', 'X-Accel-Buffering'):
        c.check(needle in gateway, 'ops/RUNBOOK.md', f'the Gateway section must cover {needle}')
    c.check('docker compose -f ops/compose.yaml up --build' in runbook, 'ops/RUNBOOK.md',
            'the quick start gives the compose command')
    for flavor_arg in ('', '--build-arg FLAVOR=gpu '):
        c.check(f'docker build -f ops/Dockerfile {flavor_arg}-t mllama-worker:' in runbook, 'ops/RUNBOOK.md',
                f'the quick start gives the image build command {flavor_arg or "(cpu)"}')
    # kubectl, where installed, builds the kustomization for real.
    kubectl = shutil.which('kubectl')
    if kubectl and files.get('ops/k8s/kustomization.yaml') is not None:
        run = subprocess.run([kubectl, 'kustomize', '--load-restrictor', 'LoadRestrictionsNone',
                              c.path('ops/k8s')], capture_output=True, text=True, timeout=60)
        c.check(run.returncode == 0, 'ops/k8s', f'kubectl kustomize: {run.stderr.strip()}')


def main():
    c = Checks(os.path.abspath(sys.argv[1]))
    files = load_inputs(c)
    own, external = parse_metrics_md(c)
    topics = parse_topics_script(c)
    prod, local = files['config/production.example.json'], files['config/local.json']
    for config_rel, config in (('config/production.example.json', prod), ('config/local.json', local)):
        for key in ('request_topic', 'dlt_topic', 'cancel_topic'):
            topic = dig(config, 'kafka', key)
            c.check(topic in topics, 'ops/compose/create-topics.sh',
                    f'does not create {topic} (kafka.{key} of {config_rel})')
    for name, (kind, _) in own.items():
        c.check(name.startswith('mllama_') and kind in ('C', 'G', 'H'), 'ops/metrics.md', f'{name}: type {kind}')
        c.check(name.endswith('_total') == (kind == 'C'), 'ops/metrics.md',
                f'{name}: counters, and only counters, end in _total')
        c.check(kind != 'H' or name.endswith(('_seconds', '_bytes')), 'ops/metrics.md',
                f'{name}: a histogram is named for its unit')
    if prod is not None:
        check_dockerfile(c, int(prod['http']['listen'].rsplit(':', 1)[1]))
        check_k8s(c, files, prod, topics, own, external)
    if files.get('ops/compose.yaml') and local is not None:
        check_compose(c, files['ops/compose.yaml'][0], local, topics)
        if prod is not None:
            check_compose_gateway(c, files['ops/compose.yaml'][0], local, prod)
    if files.get('ops/grafana/mllama-worker.json') is not None:
        check_dashboard(c, files['ops/grafana/mllama-worker.json'], own, external)
    check_scripts_and_docs(c, files)
    for failure in c.failures:
        print('FAIL', failure)
    print(f'ops static checks: {c.passed} passed, {len(c.failures)} failed')
    return 1 if c.failures else 0


if __name__ == '__main__':
    sys.exit(main())
