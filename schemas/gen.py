#!/usr/bin/env python3
"""gen.py - generates the wire codec tables, the protocol reference and the gateway's
operations (REST, MCP, dispatch) from schemas/*.json.

    python3 schemas/gen.py            rewrite every output (OUTPUTS)
                                      (and common/sbx_lifecycle_gen.{h,c}, docs/lifecycle.md)
    python3 schemas/gen.py --check    exit 1, naming the file, when a committed output is stale
    python3 schemas/gen.py --drift    list the REST/MCP differences operations.json records

The schemas are the single definition of the wire (see common/sbx_msg.h). Every
schemas/*.json but operations.json is read, in file-name order; messages, structs and
enums share one namespace across files. schemas/operations.json defines each operation
of the gateway once (docs/architecture.md, "Operations, defined once"): docs/openapi.json,
the MCP tool list and the dispatch table in common/sbx_ops_gen.{h,c} come from it.
Output depends only on the schemas, so it is reproducible and CI can compare it with
what is committed. Python 3 standard library only.

The state machines ("machines", in schemas/lifecycle.json) are generated the same way:
the broker's sandbox table and vmd's guest tables come from one description.
"""

import argparse
import glob
import json
import os
import re
import sys
import textwrap

GENERATOR = "schemas/gen.py"
OUTPUTS = ("common/sbx_msg_gen.h", "common/sbx_msg_gen.c", "docs/protocol-messages.md",
           "docs/openapi.json", "common/sbx_ops_gen.h", "common/sbx_ops_gen.c")
OPERATIONS = "operations.json"
SDK_OUTPUTS = ("sdk/python/src/sbx/_codes.py", "sdk/typescript/src/types.ts")
LIFECYCLE_OUTPUTS = ("common/sbx_lifecycle_gen.h", "common/sbx_lifecycle_gen.c", "docs/lifecycle.md")

#  Must match common/sbx_msg.h: the depth limit decode enforces, counted from the
#  envelope map (1) and the body map (2).
MAX_DEPTH = 16
DEFAULT_MAX = {"string": "64 KiB", "bytes": "16 MiB", "strlist": "10000", "strmap": "10000",
               "list": "10000"}

SCALAR_TYPES = ("string", "bytes", "bool", "int", "uint", "strlist", "strmap")
NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$")
ENUM_RE = re.compile(r"^[a-z][a-z0-9_]*$")
VALUE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
FIELD_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
C_KEYWORDS = set("""auto break case char const continue default do double else enum extern
    float for goto if inline int long register restrict return short signed sizeof static
    struct switch typedef union unsigned void volatile while bool true false""".split())
#  Names sbx_msg.h and the engine already use: a schema name that would generate one of
#  these (sbx_<name>_t, sbx_msg_<name>, sbx_<name>_name) is refused.
RESERVED_TYPES = {"msg", "msg_type", "code", "err", "bytes", "strlist", "strmap"}
RESERVED_ACCESSORS = {"new", "destroy", "dup", "eq", "encode", "decode", "new_error",
                      "new_reply", "type_name", "type_from_name", "body_to_json", "test"}
RESERVED_IDENTS = {"SBX_MSG_MAX_FRAME", "SBX_MSG_MAX_STRING", "SBX_MSG_MAX_BYTES",
                   "SBX_MSG_MAX_ITEMS", "SBX_MSG_MAX_DEPTH", "SBX_MSG_H_INCLUDED",
                   "SBX_MSG_GEN_H_INCLUDED"}


class SchemaError(Exception):
    pass


def cname(name):
    return re.sub(r"[.-]", "_", name)


def cconst(text):
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper()


def one_line(text):
    #  Docs go into // comments: no newlines, and no trailing backslash (line splice).
    return " ".join(str(text).split()).rstrip("\\")


class Schema:
    """Everything read from schemas/, validated and cross-referenced."""

    def __init__(self):
        self.files = []     # (file name, doc)
        self.errors = []    # dict(code, http, doc, file)
        self.enums = {}     # name -> dict(name, doc, values, file)
        self.types = {}     # struct-or-message name -> dict(name, doc, fields, file, msg)
        self.messages = []  # message dicts, in order
        self.machines = {}  # name -> machine dict (see _load_machines), in order


def load(schema_dir):
    s = Schema()
    paths = [p for p in sorted(glob.glob(os.path.join(schema_dir, "*.json")))
             if os.path.basename(p) != OPERATIONS]
    if not paths:
        raise SchemaError(f"no schemas in {schema_dir}")
    for path in paths:
        fname = os.path.basename(path)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise SchemaError(f"{fname}: cannot read: {e}")
        _load_file(s, fname, data)
    _validate(s)
    return s


def _need(obj, key, kind, where):
    if key not in obj:
        raise SchemaError(f"{where}: missing \"{key}\"")
    value = obj[key]
    if kind is str and not (isinstance(value, str) and value.strip()):
        raise SchemaError(f"{where}: \"{key}\" must be a non-empty string")
    if kind is not str and not isinstance(value, kind):
        raise SchemaError(f"{where}: \"{key}\" must be a {kind.__name__}")
    return value


def _only(obj, allowed, where):
    extra = sorted(set(obj) - set(allowed))
    if extra:
        raise SchemaError(f"{where}: unknown key(s) {', '.join(extra)} (allowed: {', '.join(allowed)})")


def _load_file(s, fname, data):
    if not isinstance(data, dict):
        raise SchemaError(f"{fname}: top level must be an object")
    _only(data, ("doc", "errors", "enums", "structs", "messages", "machines"), fname)
    s.files.append((fname, _need(data, "doc", str, fname)))
    for i, e in enumerate(data.get("errors", [])):
        where = f"{fname}: errors[{i}]"
        if not isinstance(e, dict):
            raise SchemaError(f"{where}: must be an object")
        _only(e, ("code", "http", "doc"), where)
        code = _need(e, "code", str, where)
        http = _need(e, "http", int, where)
        if not ENUM_RE.match(code) or code == "ok":
            raise SchemaError(f"{where}: bad code name '{code}' (lower_case, not 'ok')")
        if isinstance(http, bool) or not 100 <= http <= 599:
            raise SchemaError(f"{where}: http must be a status 100..599")
        if any(x["code"] == code for x in s.errors):
            raise SchemaError(f"{where}: error code '{code}' defined twice")
        s.errors.append({"code": code, "http": http, "doc": _need(e, "doc", str, where),
                         "file": fname})
    enums = data.get("enums", {})
    if not isinstance(enums, dict):
        raise SchemaError(f"{fname}: \"enums\" must be an object")
    for name, e in enums.items():
        where = f"{fname}: enum {name}"
        if not ENUM_RE.match(name) or name == "error_code":
            raise SchemaError(f"{where}: bad enum name (lower_case; error_code is the catalogue)")
        if name in s.enums:
            raise SchemaError(f"{where}: defined twice (also in {s.enums[name]['file']})")
        if not isinstance(e, dict):
            raise SchemaError(f"{where}: must be an object")
        _only(e, ("doc", "values"), where)
        values = _need(e, "values", list, where)
        if not values:
            raise SchemaError(f"{where}: no values")
        for v in values:
            if not isinstance(v, str) or not VALUE_RE.match(v):
                raise SchemaError(f"{where}: bad value {v!r} (lower case, digits, _ . -)")
        if len(set(values)) != len(values) or len({cconst(v) for v in values}) != len(values):
            raise SchemaError(f"{where}: duplicate values")
        s.enums[name] = {"name": name, "doc": _need(e, "doc", str, where), "values": values,
                         "file": fname}
    structs = data.get("structs", {})
    if not isinstance(structs, dict):
        raise SchemaError(f"{fname}: \"structs\" must be an object")
    for name, st in structs.items():
        where = f"{fname}: struct {name}"
        if not isinstance(st, dict):
            raise SchemaError(f"{where}: must be an object")
        _only(st, ("doc", "fields"), where)
        _add_type(s, name, st, where, fname, None)
    messages = data.get("messages", [])
    if not isinstance(messages, list):
        raise SchemaError(f"{fname}: \"messages\" must be a list")
    for i, m in enumerate(messages):
        where = f"{fname}: messages[{i}]"
        if not isinstance(m, dict):
            raise SchemaError(f"{where}: must be an object")
        _only(m, ("name", "from", "to", "reply", "event", "doc", "fields"), where)
        name = _need(m, "name", str, where)
        where = f"{fname}: message {name}"
        msg = {"from": _need(m, "from", list, where), "to": _need(m, "to", list, where),
               "reply": m.get("reply"), "event": m.get("event", False)}
        for side in ("from", "to"):
            if not msg[side] or not all(isinstance(x, str) and x for x in msg[side]):
                raise SchemaError(f"{where}: \"{side}\" must be a non-empty list of names")
        if msg["reply"] is not None and not isinstance(msg["reply"], str):
            raise SchemaError(f"{where}: \"reply\" must be a message name")
        if not isinstance(msg["event"], bool):
            raise SchemaError(f"{where}: \"event\" must be true or false")
        t = _add_type(s, name, m, where, fname, msg)
        s.messages.append(t)
    _load_machines(s, fname, data.get("machines", {}))


def _add_type(s, name, obj, where, fname, msg):
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SchemaError(f"{where}: bad name {name!r} (lower-case words joined by . or -)")
    if name in s.types:
        raise SchemaError(f"{where}: name '{name}' already used in {s.types[name]['file']}")
    fields = []
    seen = set()
    for i, f in enumerate(_need(obj, "fields", list, where)):
        fw = f"{where}: fields[{i}]"
        if not isinstance(f, dict):
            raise SchemaError(f"{fw}: must be an object")
        _only(f, ("name", "type", "required", "max", "doc"), fw)
        fname_ = _need(f, "name", str, fw)
        fw = f"{where}: field '{fname_}'"
        if not FIELD_RE.match(fname_) or fname_ in C_KEYWORDS:
            raise SchemaError(f"{fw}: bad field name (a lower_case C identifier, not a keyword)")
        if fname_ in seen:
            raise SchemaError(f"{fw}: defined twice")
        seen.add(fname_)
        ftype = _need(f, "type", str, fw)
        required = f.get("required", False)
        if not isinstance(required, bool):
            raise SchemaError(f"{fw}: \"required\" must be true or false")
        fmax = f.get("max")
        if fmax is not None and (isinstance(fmax, bool) or not isinstance(fmax, int) or fmax < 1
                                 or fmax > 2**31):
            raise SchemaError(f"{fw}: \"max\" must be a positive integer")
        fields.append({"name": fname_, "type": ftype, "required": required, "max": fmax,
                       "doc": _need(f, "doc", str, fw), "where": fw})
    t = {"name": name, "cname": cname(name), "doc": _need(obj, "doc", str, where),
         "fields": fields, "file": fname, "msg": msg}
    s.types[name] = t
    return t


def _validate(s):
    if not s.errors:
        raise SchemaError("no error catalogue: some schema must have \"errors\"")
    listed = set()
    for t in s.types.values():
        for f in t["fields"]:
            kind, _, ref = f["type"].partition(":")
            f["kind"], f["ref"] = kind, ref
            fw = f["where"]
            if kind in SCALAR_TYPES and not ref:
                pass
            elif kind == "enum" and ref:
                if ref != "error_code" and ref not in s.enums:
                    raise SchemaError(f"{fw}: unknown enum '{ref}'")
            elif kind in ("list", "struct") and ref:
                if ref not in s.types:
                    raise SchemaError(f"{fw}: unknown struct or message '{ref}'")
                if kind == "list":
                    listed.add(ref)
            else:
                raise SchemaError(f"{fw}: unknown type '{f['type']}' (string, bytes, bool, int, "
                                  "uint, strlist, strmap, enum:<enum>, list:<struct>, struct:<struct>)")
            if f["max"] is not None and kind not in ("string", "bytes", "strlist", "strmap", "list"):
                raise SchemaError(f"{fw}: \"max\" applies to string, bytes and lists only")
    for m in s.messages:
        reply = m["msg"]["reply"]
        if reply is not None and (reply not in s.types or s.types[reply]["msg"] is None):
            raise SchemaError(f"{m['file']}: message {m['name']}: reply '{reply}' is not a message")
    if "caller" not in s.types or s.types["caller"]["msg"] is not None:
        raise SchemaError("a struct named 'caller' must exist: the envelope carries it")
    err = s.types.get("error")
    fields = {f["name"]: f for f in err["fields"]} if err and err["msg"] else {}
    if (fields.get("code", {}).get("type") != "enum:error_code"
            or fields.get("message", {}).get("type") != "string"):
        raise SchemaError("a message named 'error' with fields code (enum:error_code) and "
                          "message (string) must exist: sbx_msg_new_error fills it")
    s.listed = [t for t in s.types.values() if t["name"] in listed]
    _check_required_depth(s)
    idents = _check_identifiers(s)
    _validate_machines(s, idents)


def _check_required_depth(s):
    #  A required struct field must be filled, so a cycle of them could never be encoded,
    #  and a required chain deeper than the decoder's limit could never be decoded.
    memo = {}

    def depth(name, stack):
        if name in stack:
            raise SchemaError(f"required struct fields form a cycle: {' -> '.join(stack + [name])}")
        if name in memo:
            return memo[name]
        d = 1
        for f in s.types[name]["fields"]:
            if not f["required"]:
                continue
            if f["kind"] == "struct":
                d = max(d, 1 + depth(f["ref"], stack + [name]))
            elif f["kind"] in ("strlist", "strmap", "list"):
                d = max(d, 2)
        memo[name] = d
        return d

    for t in s.types.values():
        d = depth(t["name"], [])
        if t["msg"] is not None and 1 + d > MAX_DEPTH:
            raise SchemaError(f"message {t['name']}: required fields nest {1 + d} deep, "
                              f"the wire allows {MAX_DEPTH}")
        if t["name"] == "caller" and 1 + d > MAX_DEPTH:
            raise SchemaError("struct caller nests too deep")


def _check_identifiers(s):
    idents = {}

    def claim(ident, origin):
        if ident in RESERVED_IDENTS:
            raise SchemaError(f"{origin}: generates {ident}, which sbx_msg.h already uses")
        if ident in idents:
            raise SchemaError(f"{origin}: generates {ident}, as does {idents[ident]}")
        idents[ident] = origin

    def reserved(name, origin):
        if name in RESERVED_TYPES or name == "meta" or name.startswith("meta_"):
            raise SchemaError(f"{origin}: the name '{name}' is reserved for the codec")

    claim("SBX_OK", "the catalogue")
    claim("SBX_CODE__COUNT", "the catalogue")
    claim("SBX_MSG__UNKNOWN", "message types")
    claim("SBX_MSG__COUNT", "message types")
    for e in s.errors:
        claim("SBX_E_" + cconst(e["code"]), f"{e['file']}: error {e['code']}")
    for e in s.enums.values():
        origin = f"{e['file']}: enum {e['name']}"
        reserved(e["name"], origin)
        claim(f"sbx_{e['name']}_t", origin)
        claim(f"sbx_{e['name']}_name", origin)
        claim(f"sbx_{e['name']}_from_name", origin)
        claim(f"SBX_{cconst(e['name'])}__UNSET", origin)
        for v in e["values"]:
            claim(f"SBX_{cconst(e['name'])}_{cconst(v)}", origin)
    for t in s.types.values():
        origin = f"{t['file']}: {'message' if t['msg'] else 'struct'} {t['name']}"
        reserved(t["cname"], origin)
        claim(f"sbx_{t['cname']}_t", origin)
        if t["msg"] is not None:
            if t["cname"] in RESERVED_ACCESSORS:
                raise SchemaError(f"{origin}: sbx_msg_{t['cname']} is already an sbx_msg function")
            claim(f"sbx_msg_{t['cname']}", origin)
            claim(f"SBX_MSG_{cconst(t['name'])}", origin)
    for t in s.listed:
        claim(f"sbx_{t['cname']}_list_t", f"list:{t['name']}")
        claim(f"sbx_{t['cname']}_list_append", f"list:{t['name']}")
    return idents


# ---------------------------------------------------------------------------------------
#  C output

def c_type(s, f):
    kind, ref = f["kind"], f["ref"]
    if kind == "enum":
        return "sbx_code_t" if ref == "error_code" else f"sbx_{ref}_t"
    if kind == "list":
        return f"sbx_{cname(ref)}_list_t"
    if kind == "struct":
        return f"sbx_{cname(ref)}_t *"
    return {"string": "char *", "bytes": "sbx_bytes_t", "bool": "bool", "int": "int64_t",
            "uint": "uint64_t", "strlist": "sbx_strlist_t", "strmap": "sbx_strmap_t"}[kind]


def comment(text, indent="", width=96):
    lines = textwrap.wrap(one_line(text), width=width - len(indent) - 4,
                          break_long_words=False, break_on_hyphens=False)
    return [f"{indent}//  {line}" for line in lines]


def aligned(rows, indent="    "):
    #  Lines of (code, trailing comment), comments in one column as clang-format would.
    width = max(len(code) for code, _ in rows)
    return [f"{indent}{code.ljust(width)} //  {note}" for code, note in rows]


def field_note(f):
    notes = []
    if f["required"]:
        notes.append("required")
    if f["max"] is not None:
        notes.append(f"max {f['max']}")
    prefix = ", ".join(notes)
    return f"({prefix}) {f['doc']}" if prefix else f["doc"]


def gen_header(s):
    o = []
    w = o.append
    w(f"//  GENERATED by {GENERATOR} from the schemas/ files - do not edit: change the schemas")
    w(f"//  and run `python3 {GENERATOR}`. Included by sbx_msg.h; see it for the rules.")
    w("#ifndef SBX_MSG_GEN_H_INCLUDED")
    w("#define SBX_MSG_GEN_H_INCLUDED")
    w("")
    w("#include <stdbool.h>")
    w("#include <stddef.h>")
    w("#include <stdint.h>")
    w("")
    w("#ifdef __cplusplus")
    w('extern "C" {')
    w("#endif")
    w("")
    w("struct sbx_msg_s;")
    w("")
    w("//  Error codes: the catalogue. SBX_OK (0) is not an error; on the wire a code is its name.")
    w("typedef enum {")
    w("    SBX_OK = 0,")
    for e in s.errors:
        o.extend(comment(f"{e['code']} ({e['http']}): {e['doc']}", "    "))
        w(f"    SBX_E_{cconst(e['code'])},")
    w("    SBX_CODE__COUNT")
    w("} sbx_code_t;")
    w("")
    w("//  Enums: 0 is unset (never sent; a required enum that is unset fails encode).")
    w("//  _name returns NULL for unset or unknown values; _from_name returns 0 or -1.")
    for e in s.enums.values():
        w("")
        o.extend(comment(f"{e['name']} ({e['file']}): {e['doc']}"))
        w("typedef enum {")
        w(f"    SBX_{cconst(e['name'])}__UNSET = 0,")
        o.extend(aligned([(f"SBX_{cconst(e['name'])}_{cconst(v)},", f'"{v}"')
                          for v in e["values"]]))
        w(f"}} sbx_{e['name']}_t;")
        w(f"const char *sbx_{e['name']}_name (sbx_{e['name']}_t value);")
        w(f"int sbx_{e['name']}_from_name (const char *name, sbx_{e['name']}_t *value_p);")
    w("")
    w("//  Owned containers. A message owns everything it points to: set fields with")
    w("//  sbx_str_set, sbx_bytes_set, sbx_strlist_append, sbx_strmap_set, <struct>_list_append.")
    w("typedef struct {")
    w("    uint8_t *data; //  NULL = absent; non-NULL with size 0 = present and empty")
    w("    size_t size;")
    w("} sbx_bytes_t;")
    w("typedef struct {")
    w("    char **items;")
    w("    size_t count;")
    w("} sbx_strlist_t;")
    w("typedef struct {")
    w("    char **keys;")
    w("    char **values;")
    w("    size_t count;")
    w("} sbx_strmap_t;")
    w("")
    w("//  Message types, as named on the wire.")
    w("typedef enum {")
    w("    SBX_MSG__UNKNOWN = 0,")
    o.extend(aligned([(f"SBX_MSG_{cconst(m['name'])},", m["name"]) for m in s.messages]))
    w("    SBX_MSG__COUNT")
    w("} sbx_msg_type_t;")
    w("")
    w("//  Structs and message bodies. Absent: NULL pointers, empty lists, 0 numbers.")
    for t in s.types.values():
        w(f"typedef struct sbx_{t['cname']}_s sbx_{t['cname']}_t;")
    if s.listed:
        w("")
        w("//  Lists of structs; _append returns a zeroed new last item, or NULL when out of memory.")
    for t in s.listed:
        w("typedef struct {")
        w(f"    sbx_{t['cname']}_t *items;")
        w("    size_t count;")
        w(f"}} sbx_{t['cname']}_list_t;")
        w(f"sbx_{t['cname']}_t *sbx_{t['cname']}_list_append (sbx_{t['cname']}_list_t *list);")
    for t in s.types.values():
        w("")
        m = t["msg"]
        if m is not None:
            head = f"message {t['name']} ({t['file']}): {', '.join(m['from'])} -> {', '.join(m['to'])}"
            if m["reply"]:
                head += f", reply {m['reply']}"
            if m["event"]:
                head += ", event"
        else:
            head = f"struct {t['name']} ({t['file']})"
        o.extend(comment(f"{head}. {t['doc']}"))
        w(f"struct sbx_{t['cname']}_s {{")
        if not t["fields"]:
            w("    char unused_; //  C wants a member; this body has no fields")
        for f in t["fields"]:
            o.extend(comment(field_note(f), "    "))
            ctype = c_type(s, f)
            sep = "" if ctype.endswith("*") else " "
            w(f"    {ctype}{sep}{f['name']};")
        w("};")
    w("")
    w("//  Typed access to a message's body: NULL unless msg is of that type.")
    for m in s.messages:
        w(f"sbx_{m['cname']}_t *sbx_msg_{m['cname']} (struct sbx_msg_s *msg);")
    w("")
    w("//  The subject: the sandbox a message is about, whatever its type. Every message about")
    w("//  one sandbox names it in a field `sandbox_id` (or carries it whole in `sandbox`), so")
    w("//  code that routes, caches or logs by sandbox needs no switch on the type.")
    w("//  sbx_msg_subject: that id (borrowed), or NULL for a type about no one sandbox.")
    w("//  sbx_msg_set_subject: sets sandbox_id; 0, or -1 when the type has none.")
    w("//  sbx_msg_sandbox_slot: where a message carries a sandbox_info (`sandbox`), or NULL.")
    w("const char *sbx_msg_subject (const struct sbx_msg_s *msg);")
    w("int sbx_msg_set_subject (struct sbx_msg_s *msg, const char *sandbox_id);")
    w("sbx_sandbox_info_t **sbx_msg_sandbox_slot (struct sbx_msg_s *msg);")
    w("")
    w("#ifdef __cplusplus")
    w("}")
    w("#endif")
    w("")
    w("#endif")
    return "\n".join(o) + "\n"


def kind_const(f):
    return "SBX_META_" + f["kind"].upper()


def gen_source(s):
    o = []
    w = o.append
    w(f"//  GENERATED by {GENERATOR} from the schemas/ files - do not edit: change the schemas")
    w(f"//  and run `python3 {GENERATOR}`. The tables the engine in sbx_msg.c walks.")
    w('#include "sbx_msg.h"')
    w('#include "sbx_msg_meta.h"')
    w("")
    w("#include <stdlib.h>")
    w("#include <string.h>")
    w("")
    w("//  The engine reads every list and enum field through one layout.")
    w("_Static_assert (sizeof (sbx_code_t) == sizeof (int), \"enums are int-sized\");")
    for e in s.enums.values():
        w(f"_Static_assert (sizeof (sbx_{e['name']}_t) == sizeof (int), \"enums are int-sized\");")
    for t in s.listed:
        w(f"_Static_assert (offsetof (sbx_{t['cname']}_list_t, count) == sizeof (void *), "
          "\"list layout\");")
    w("")
    w("//  Error catalogue.")
    w("static const char *const s_code_names[] = {")
    w('    "ok",')
    for e in s.errors:
        w(f'    "{e["code"]}",')
    w("};")
    w("const sbx_meta_enum_t sbx_meta_code = {\"error_code\", s_code_names, SBX_CODE__COUNT};")
    w("const int sbx_meta_code_http[SBX_CODE__COUNT] = {")
    w("    200,")
    o.extend(aligned([(f"{e['http']},", e["code"]) for e in s.errors]))
    w("};")
    for e in s.enums.values():
        n = e["name"]
        w("")
        w(f"static const char *const s_enum_{n}_values[] = {{")
        w("    NULL,")
        for v in e["values"]:
            w(f'    "{v}",')
        w("};")
        w(f"static const sbx_meta_enum_t s_enum_{n} = {{\"{n}\", s_enum_{n}_values, "
          f"{len(e['values']) + 1}}};")
        w("")
        w(f"const char *sbx_{n}_name (sbx_{n}_t value)")
        w("{")
        w(f"    return sbx_meta_enum_name (&s_enum_{n}, (int) value);")
        w("}")
        w("")
        w(f"int sbx_{n}_from_name (const char *name, sbx_{n}_t *value_p)")
        w("{")
        w("    int value;")
        w(f"    if (sbx_meta_enum_from_name (&s_enum_{n}, name, &value))")
        w("        return -1;")
        w("    if (value_p)")
        w(f"        *value_p = (sbx_{n}_t) value;")
        w("    return 0;")
        w("}")
    w("")
    w("//  Structs and message bodies.")
    for t in s.types.values():
        w(f"static const sbx_meta_struct_t s_meta_{t['cname']};")
    for t in s.types.values():
        w("")
        tn = f"sbx_{t['cname']}_t"
        if t["fields"]:
            w(f"static const sbx_meta_field_t s_fields_{t['cname']}[] = {{")
            for f in t["fields"]:
                enum_ref = "NULL"
                if f["kind"] == "enum":
                    enum_ref = "&sbx_meta_code" if f["ref"] == "error_code" else f"&s_enum_{f['ref']}"
                struct_ref = f"&s_meta_{cname(f['ref'])}" if f["kind"] in ("list", "struct") else "NULL"
                w(f'    {{"{f["name"]}", {kind_const(f)}, offsetof ({tn}, {f["name"]}), '
                  f'{"true" if f["required"] else "false"}, {f["max"] or 0}, {enum_ref}, {struct_ref}}},')
            w("};")
            fields_ref, count = f"s_fields_{t['cname']}", len(t["fields"])
        else:
            fields_ref, count = "NULL", 0
        w(f'static const sbx_meta_struct_t s_meta_{t["cname"]} = {{"{t["name"]}", sizeof ({tn}), '
          f"{fields_ref}, {count}}};")
    w("")
    w("const sbx_meta_struct_t *const sbx_meta_caller = &s_meta_caller;")
    w("")
    w("//  Message types.")
    for m in s.messages:
        for side in ("from", "to"):
            names = ", ".join(f'"{x}"' for x in m["msg"][side])
            w(f"static const char *const s_{side}_{m['cname']}[] = {{{names}}};")
    w("")
    w("const sbx_meta_msg_t sbx_meta_msgs[SBX_MSG__COUNT] = {")
    w("    {NULL, NULL, NULL, 0, NULL, 0, SBX_MSG__UNKNOWN, false},")
    for m in s.messages:
        mm = m["msg"]
        reply = f"SBX_MSG_{cconst(mm['reply'])}" if mm["reply"] else "SBX_MSG__UNKNOWN"
        w(f'    {{"{m["name"]}", &s_meta_{m["cname"]}, s_from_{m["cname"]}, {len(mm["from"])}, '
          f's_to_{m["cname"]}, {len(mm["to"])}, {reply}, {"true" if mm["event"] else "false"}}},')
    w("};")
    w("")
    w("//  Typed accessors.")
    for m in s.messages:
        w("")
        w(f"sbx_{m['cname']}_t *sbx_msg_{m['cname']} (struct sbx_msg_s *msg)")
        w("{")
        w(f"    return msg && msg->type == SBX_MSG_{cconst(m['name'])} ? "
          f"(sbx_{m['cname']}_t *) msg->body : NULL;")
        w("}")
    w("")
    w("//  The subject's place in each body (offset + 1; 0: the type has none).")
    subject, slot = [], []
    for m in s.messages:
        tn = f"sbx_{m['cname']}_t"
        const = f"SBX_MSG_{cconst(m['name'])}"
        for f in m["fields"]:
            if f["name"] == "sandbox_id" and f["kind"] == "string":
                subject.append(f"    [{const}] = offsetof ({tn}, sandbox_id) + 1,")
            if f["name"] == "sandbox" and f["kind"] == "struct" and f["ref"] == "sandbox_info":
                slot.append(f"    [{const}] = offsetof ({tn}, sandbox) + 1,")
    w("static const size_t s_subject_at[SBX_MSG__COUNT] = {")
    o.extend(subject)
    w("};")
    w("static const size_t s_sandbox_at[SBX_MSG__COUNT] = {")
    o.extend(slot)
    w("};")
    w("")
    w("static void *s_at (const struct sbx_msg_s *msg, const size_t *table)")
    w("{")
    w("    if (!msg || !msg->body || msg->type <= SBX_MSG__UNKNOWN || msg->type >= SBX_MSG__COUNT ||")
    w("        !table[msg->type])")
    w("        return NULL;")
    w("    return (char *) msg->body + table[msg->type] - 1;")
    w("}")
    w("")
    w("sbx_sandbox_info_t **sbx_msg_sandbox_slot (struct sbx_msg_s *msg)")
    w("{")
    w("    return (sbx_sandbox_info_t **) s_at (msg, s_sandbox_at);")
    w("}")
    w("")
    w("const char *sbx_msg_subject (const struct sbx_msg_s *msg)")
    w("{")
    w("    char **id = (char **) s_at (msg, s_subject_at);")
    w("    if (id)")
    w("        return *id;")
    w("    sbx_sandbox_info_t **sandbox = (sbx_sandbox_info_t **) s_at (msg, s_sandbox_at);")
    w("    return sandbox && *sandbox ? (*sandbox)->id : NULL;")
    w("}")
    w("")
    w("int sbx_msg_set_subject (struct sbx_msg_s *msg, const char *sandbox_id)")
    w("{")
    w("    char **id = (char **) s_at (msg, s_subject_at);")
    w("    return id ? sbx_str_set (id, sandbox_id) : -1;")
    w("}")
    for t in s.listed:
        n = t["cname"]
        w("")
        w(f"sbx_{n}_t *sbx_{n}_list_append (sbx_{n}_list_t *list)")
        w("{")
        w(f"    return (sbx_{n}_t *) sbx_meta_list_append ((void **) &list->items, &list->count, "
          f"sizeof (sbx_{n}_t));")
        w("}")
    return "\n".join(o) + "\n"


# ---------------------------------------------------------------------------------------
#  Markdown reference

def md(text):
    return one_line(text).replace("|", "\\|")


def md_type(s, f):
    kind, ref = f["kind"], f["ref"]
    if kind == "enum":
        if ref == "error_code":
            return "enum:[error_code](#errors)"
        return f"enum:[{ref}](#enum-{ref})"
    if kind in ("list", "struct"):
        t = s.types[ref]
        anchor = ("msg-" if t["msg"] else "struct-") + ref.replace(".", "-")
        return f"{kind}:[{ref}](#{anchor})"
    return kind


def md_fields(s, t, o):
    if not t["fields"]:
        o.append("No fields.")
        o.append("")
        return
    o.append("| field | type | required | limit | doc |")
    o.append("|---|---|---|---|---|")
    for f in t["fields"]:
        limit = str(f["max"]) if f["max"] is not None else ""
        if not limit and f["kind"] in DEFAULT_MAX:
            limit = f"({DEFAULT_MAX[f['kind']]})"
        o.append(f"| `{f['name']}` | {md_type(s, f)} | {'yes' if f['required'] else ''} | "
                 f"{limit} | {md(f['doc'])} |")
    o.append("")


def gen_markdown(s):
    o = []
    w = o.append
    w(f"<!-- GENERATED by {GENERATOR} from schemas/*.json - do not edit. -->")
    w("# sbx wire protocol: messages")
    w("")
    w("Every frame between sbx processes is one msgpack map: `{\"type\": name, \"rid\": uint, "
      "\"caller\": caller, \"route\": str, \"instance\": str, \"timeout_ms\": uint, "
      "\"body\": {...}}`. Only `type` is required; `body` may be left out when the message has "
      "no required fields. Unknown keys are ignored at every level, so a newer peer can talk to "
      "an older one. Enums and error codes travel as their names, `bytes` as msgpack bin, "
      "`strlist` as an array of strings, `strmap` as a map of strings. Absent numbers read as 0; "
      "a required field that is absent makes the frame invalid. Strings are UTF-8 without NUL.")
    w("")
    w(f"Limits without a `max`: strings {DEFAULT_MAX['string']}, bytes {DEFAULT_MAX['bytes']}, "
      f"lists and maps {DEFAULT_MAX['list']} items; frames 32 MiB; nesting {MAX_DEPTH} levels. "
      "A frame that breaks a rule is answered with an `error` reply "
      "(`invalid_argument`, or `too_large` for a limit).")
    w("")
    w("C: `common/sbx_msg.h` (the codec API) and `common/sbx_msg_gen.h` (the types below). "
      "Message `peer.hello` is `SBX_MSG_PEER_HELLO`, body `sbx_peer_hello_t`, accessor "
      "`sbx_msg_peer_hello (msg)`.")
    w("")
    w("## Contents")
    w("")
    for fname, _ in s.files:
        names = [t for t in s.messages if t["file"] == fname]
        if names:
            links = ", ".join(f"[{t['name']}](#msg-{t['name'].replace('.', '-')})" for t in names)
            w(f"- {fname}: {links}")
    w("- [Error codes](#errors)")
    for fname, doc in s.files:
        w("")
        w(f"## {fname}")
        w("")
        w(md(doc))
        w("")
        for t in s.messages:
            if t["file"] != fname:
                continue
            m = t["msg"]
            w(f"<a id=\"msg-{t['name'].replace('.', '-')}\"></a>")
            w(f"### {t['name']}{' (event)' if m['event'] else ''}")
            w("")
            line = f"{', '.join(m['from'])} → {', '.join(m['to'])}"
            if m["reply"]:
                line += f"; reply: [{m['reply']}](#msg-{m['reply'].replace('.', '-')})"
            w(f"*{line}*")
            w("")
            w(md(t["doc"]))
            w("")
            md_fields(s, t, o)
        for t in s.types.values():
            if t["file"] != fname or t["msg"] is not None:
                continue
            w(f"<a id=\"struct-{t['name'].replace('.', '-')}\"></a>")
            w(f"### struct {t['name']}")
            w("")
            w(md(t["doc"]))
            w("")
            md_fields(s, t, o)
        for e in s.enums.values():
            if e["file"] != fname:
                continue
            w(f"<a id=\"enum-{e['name']}\"></a>")
            w(f"### enum {e['name']}")
            w("")
            w(md(e["doc"]))
            w("")
            w("Values: " + ", ".join(f"`{v}`" for v in e["values"]))
            w("")
    w("<a id=\"errors\"></a>")
    w("## Error codes")
    w("")
    w("The `code` of an `error` reply. The gateway answers REST calls with the HTTP status shown.")
    w("")
    w("| code | C | HTTP | meaning |")
    w("|---|---|---|---|")
    for e in s.errors:
        w(f"| `{e['code']}` | `SBX_E_{cconst(e['code'])}` | {e['http']} | {md(e['doc'])} |")
    return "\n".join(o) + "\n"


# ---------------------------------------------------------------------------------------
#  Operations: schemas/operations.json, the gateway's operations defined once, generates
#  docs/openapi.json (REST), the MCP tool list and the dispatch table (sbx_ops_gen.{h,c}).

OPS_SURFACES = ("mcp", "rest")
#  The order an Allow header (and docs/openapi.json) lists a path's methods.
OPS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#  Annotations tools/list has never carried (its descriptions state defaults); the MCP
#  rendering leaves them out.
OPS_MCP_DROPS = ("default", "examples", "format")
#  What an argument says besides its value's JSON Schema.
OPS_ARG_KEYS = ("name", "in", "required", "surfaces", "mcp", "rest", "drift", "ref")
OPS_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
OPS_ARG_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def _apply(obj, override):
    #  A surface's differences: each key replaces the one beside it, null removes it.
    out = dict(obj)
    for k, v in (override or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _on(obj, surface, default=OPS_SURFACES):
    return surface in obj.get("surfaces", default)


class Ops:
    """schemas/operations.json, validated against the message schemas."""

    def __init__(self, s, data):
        self.s = s
        self.doc = data
        comp = data["components"]
        self.responses = comp["responses"]
        self.shapes = comp["schemas"]
        self.arguments = comp["arguments"]
        self.words = comp["words"]
        self.texts = comp["texts"]
        self.ops = data["operations"]


def load_operations(s, path):
    fname = os.path.basename(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SchemaError(f"{fname}: cannot read: {e}")
    if not isinstance(data, dict):
        raise SchemaError(f"{fname}: top level must be an object")
    _only(data, ("doc", "openapi", "components", "operations"), fname)
    _need(data, "doc", str, fname)
    _need(data, "openapi", dict, fname)
    comp = _need(data, "components", dict, fname)
    _only(comp, ("securitySchemes", "responses", "schemas", "arguments", "words", "texts"),
          f"{fname}: components")
    for key in ("securitySchemes", "responses", "schemas", "arguments", "words", "texts"):
        _need(comp, key, dict, f"{fname}: components")
    _need(data, "operations", list, fname)
    o = Ops(s, data)
    for table, words in o.words.items():
        if not isinstance(words, dict) or "*" not in words or \
                any(not isinstance(v, str) for v in words.values()):
            raise SchemaError(f"{fname}: words {table}: an object of texts with a \"*\" default")
        for v in words.values():
            if v.startswith("@") and v[1:] not in o.words:
                raise SchemaError(f"{fname}: words {table}: no words {v[1:]}")
    if "Error" not in o.shapes:
        raise SchemaError(f"{fname}: components.schemas needs Error: every error response carries it")
    for name, r in o.responses.items():
        where = f"{fname}: response {name}"
        _only(r, ("status", "description", "headers"), where)
        status = _need(r, "status", int, where)
        if isinstance(status, bool) or not 400 <= status <= 599:
            raise SchemaError(f"{where}: status must be 400..599")
        _need(r, "description", str, where)
    for name, shape in o.shapes.items():
        for surface in OPS_SURFACES:
            _schema(o, shape, surface, f"{fname}: schema {name}")
    seen = {"names": set(), "ids": set(), "routes": set()}
    for i, op in enumerate(o.ops):
        if not isinstance(op, dict):
            raise SchemaError(f"{fname}: operations[{i}]: must be an object")
        _check_operation(o, op, fname, i, seen)
    return o


def _check_operation(o, op, fname, i, seen):
    where = f"{fname}: operations[{i}]"
    _only(op, ("name", "surfaces", "title", "description", "annotations", "message",
               "deadline_ms", "text", "arguments", "output", "mcp", "rest", "drift"), where)
    name = _need(op, "name", str, where)
    where = f"{fname}: operation {name}"
    if not OPS_NAME_RE.match(name) or name in seen["names"]:
        raise SchemaError(f"{where}: bad or repeated name (lower_case, once)")
    seen["names"].add(name)
    surfaces = _need(op, "surfaces", list, where)
    if not surfaces or any(x not in OPS_SURFACES for x in surfaces) or len(set(surfaces)) != len(surfaces):
        raise SchemaError(f"{where}: surfaces is a list of mcp and/or rest")
    notes = _need(op, "annotations", dict, where)
    _only(notes, ("readOnlyHint", "destructiveHint"), f"{where}: annotations")
    ro = _need(notes, "readOnlyHint", bool, where)
    #  As the MCP reference has it: destructiveHint only when not read-only.
    if ro == ("destructiveHint" in notes) or not isinstance(notes.get("destructiveHint", False), bool):
        raise SchemaError(f"{where}: destructiveHint (true or false) exactly when not readOnlyHint")
    if "message" not in op:
        raise SchemaError(f"{where}: missing \"message\" (null: the gateway answers itself)")
    message = op["message"]
    if message is None:
        if "deadline_ms" in op:
            raise SchemaError(f"{where}: deadline_ms without a message")
    else:
        if not isinstance(message, str) or message not in o.s.types or o.s.types[message]["msg"] is None:
            raise SchemaError(f"{where}: message {message!r} is not a message of schemas/*.json")
        deadline = _need(op, "deadline_ms", int, where)
        if isinstance(deadline, bool) or not 0 < deadline < 2**32:
            raise SchemaError(f"{where}: deadline_ms must be a positive number of ms")
    if "drift" in op:
        _need(op, "drift", str, where)
    _need(op, "arguments", list, where)
    if "mcp" in surfaces:
        _need(op, "title", str, where)
        _need(op, "description", str, where)
        _only(op.get("mcp", {}), ("output",), f"{where}: mcp")
        out = _output(o, op, "mcp")
        if out is None or out.get("type") != "object":
            raise SchemaError(f"{where}: an MCP tool needs an output, an object schema")
        op_text(o, op)  # checked: its fields, arguments, sections, words and formats
    elif "title" in op or "mcp" in op or "text" in op:
        raise SchemaError(f"{where}: title and mcp are for MCP tools")
    for surface in surfaces:
        names = [a["name"] for a in op_args(o, op, surface)]
        if len(set(names)) != len(names):
            raise SchemaError(f"{where}: an argument name repeats on {surface}")
    if "rest" in surfaces:
        _check_rest(o, op, _need(op, "rest", dict, where), f"{where}: rest", seen)
        _output(o, op, "rest")
    elif "rest" in op:
        raise SchemaError(f"{where}: rest without rest in surfaces")


def _check_rest(o, op, r, where, seen):
    _only(r, ("method", "path", "operationId", "tags", "security", "summary", "description",
              "body", "success", "responses", "errors"), where)
    method, path = _need(r, "method", str, where), _need(r, "path", str, where)
    if method not in OPS_METHODS or not path.startswith("/v1/") or (method, path) in seen["routes"]:
        raise SchemaError(f"{where}: method one of {', '.join(OPS_METHODS)}, path under /v1/, "
                          "each route once")
    seen["routes"].add((method, path))
    #  docs/rest.md: a read-only key may only GET; gw_rest checks read_only. A WebSocket
    #  route is a GET (the upgrade) that may write all the same (a terminal).
    websocket = "websocket" in r.get("success", {})
    if websocket and (method != "GET" or r["success"].get("status") != 101):
        raise SchemaError(f"{where}: a WebSocket route is a GET answered 101")
    if not websocket and op["annotations"]["readOnlyHint"] != (method == "GET"):
        raise SchemaError(f"{where}: readOnlyHint exactly when the method is GET")
    op_id = _need(r, "operationId", str, where)
    if op_id in seen["ids"]:
        raise SchemaError(f"{where}: operationId {op_id} used twice")
    seen["ids"].add(op_id)
    _need(r, "summary", str, where)
    tags = [t["name"] for t in o.doc["openapi"].get("tags", [])]
    if any(t not in tags for t in r.get("tags", [])):
        raise SchemaError(f"{where}: a tag that openapi.tags does not list")
    success = _need(r, "success", dict, where)
    _only(success, ("status", "description", "headers", "media", "schema", "stream", "websocket"),
          f"{where}: success")
    if websocket:
        ws = _need(success, "websocket", dict, f"{where}: success")
        _only(ws, ("description", "client", "server"), f"{where}: success websocket")
        _need(ws, "description", str, f"{where}: success websocket")
        for side in ("client", "server"):
            for name, m in _need(ws, side, dict, f"{where}: success websocket").items():
                _only(m, ("description", "frame", "schema"), f"{where}: websocket {side} {name}")
                _need(m, "description", str, f"{where}: websocket {side} {name}")
                if _need(m, "frame", str, f"{where}: websocket {side} {name}") not in ("text", "binary"):
                    raise SchemaError(f"{where}: websocket {side} {name}: frame text or binary")
    if "stream" in success:
        stream = _need(success, "stream", dict, f"{where}: success")
        _only(stream, ("description", "events"), f"{where}: success stream")
        _need(stream, "description", str, f"{where}: success stream")
        for name, event in _need(stream, "events", dict, f"{where}: success stream").items():
            _only(event, ("description", "schema"), f"{where}: stream event {name}")
            _need(event, "description", str, f"{where}: stream event {name}")
    _need(success, "status", int, f"{where}: success")
    _need(success, "description", str, f"{where}: success")
    if "schema" not in success and "output" not in op and not websocket:
        raise SchemaError(f"{where}: success needs a schema, or the operation an output")
    for err in _need(r, "errors", list, where):
        if err not in o.responses:
            raise SchemaError(f"{where}: errors: no response {err!r} in components.responses")
    for status, extra in r.get("responses", {}).items():
        _only(extra, ("description", "schema"), f"{where}: responses {status}")
        if not status.isdigit():
            raise SchemaError(f"{where}: responses are keyed by status")
        _need(extra, "description", str, f"{where}: responses {status}")
        _need(extra, "schema", dict, f"{where}: responses {status}")
    params = re.findall(r"\{([^}]+)\}", path)
    args = op_args(o, op, "rest")
    for a in args:
        aw = f"{where}: argument {a['name']}"
        if a["in"] not in ("path", "query", "body"):
            raise SchemaError(f"{aw}: REST takes it from path, query or body (\"in\")")
        if (a["in"] == "path") != (a["name"] in params):
            raise SchemaError(f"{aw}: in path exactly when the path has {{{a['name']}}}")
        if a["in"] == "path" and not a["required"]:
            raise SchemaError(f"{aw}: a path parameter is required")
    if sorted(params) != sorted(a["name"] for a in args if a["in"] == "path"):
        raise SchemaError(f"{where}: every {{x}} of the path needs an argument")
    body = r.get("body")
    has_body = any(a["in"] == "body" for a in args)
    if body is not None:
        _only(body, ("name", "required", "minProperties", "media", "schema"), f"{where}: body")
        _need(body, "required", bool, f"{where}: body")
        if has_body == ("schema" in body):
            raise SchemaError(f"{where}: body is either the body arguments or a schema (raw)")
        if body.get("name") in o.shapes:
            raise SchemaError(f"{where}: body name {body['name']} is a shape's already")
    elif has_body:
        raise SchemaError(f"{where}: body arguments need rest.body")


def _arg(o, arg, where):
    #  An argument with its shared definition (ref) under it: the use site's keys replace
    #  the shared ones, its mcp and rest merge key by key.
    if not isinstance(arg, dict):
        raise SchemaError(f"{where}: an argument must be an object")
    if "ref" not in arg:
        return arg
    ref = arg["ref"]
    if ref not in o.arguments:
        raise SchemaError(f"{where}: no argument {ref!r} in components.arguments")
    base = o.arguments[ref]
    out = _apply(base, {k: v for k, v in arg.items() if k not in ("ref", "mcp", "rest")})
    for surface in OPS_SURFACES:
        if surface in arg:
            out[surface] = {**base.get(surface, {}), **arg[surface]}
    return out


def op_args(o, op, surface):
    """The operation's arguments on surface: dicts of name, in, required and schema."""
    out = []
    for i, raw in enumerate(op.get("arguments", [])):
        where = f"operation {op['name']}: arguments[{i}]"
        arg = _arg(o, raw, where)
        if not _on(arg, surface, op["surfaces"]):
            continue
        if any(x not in op["surfaces"] for x in arg.get("surfaces", [])):
            raise SchemaError(f"{where}: surfaces beyond the operation's")
        view = _apply({k: v for k, v in arg.items() if k not in OPS_SURFACES}, arg.get(surface))
        name = view.get("name")
        if not isinstance(name, str) or not OPS_ARG_RE.match(name):
            raise SchemaError(f"{where}: bad argument name {name!r}")
        if not isinstance(view.get("required", False), bool):
            raise SchemaError(f"{where}: required is true or false")
        schema = {k: v for k, v in view.items() if k not in OPS_ARG_KEYS}
        if "type" not in schema:
            raise SchemaError(f"{where}: argument {name} needs a type")
        out.append({"name": name, "in": view.get("in"), "required": view.get("required", False),
                    "schema": _schema(o, schema, surface, f"{where} ({name})")})
    return out


def _output(o, op, surface):
    #  What the operation answers on surface: an op's mcp.output replaces its output there.
    out = op.get(surface, {}).get("output", op.get("output")) if surface == "mcp" else op.get("output")
    return None if out is None else _schema(o, out, surface, f"operation {op['name']}: output")


def _schema(o, node, surface, where):
    """node as surface sees it: $ref resolved (REST: a components reference; MCP: inlined),
    overrides applied, properties of the other surface left out; MCP also without
    OPS_MCP_DROPS and with allOf merged into one object schema."""
    if not isinstance(node, dict):
        raise SchemaError(f"{where}: a schema must be an object")
    if "$ref" in node:
        ref = node["$ref"]
        if ref not in o.shapes or set(node) - {"$ref", "mcp"}:
            raise SchemaError(f"{where}: $ref {ref!r} must name a shape; only mcp may sit beside it")
        if surface == "rest":
            return {"$ref": f"#/components/schemas/{ref}"}
        return _apply(_schema(o, o.shapes[ref], surface, f"{where} -> {ref}"), node.get("mcp"))
    out = _apply({k: v for k, v in node.items() if k not in OPS_SURFACES + ("surfaces",)},
                 node.get(surface))
    if "enum_codes" in out:
        out = {("enum" if k == "enum_codes" else k): ([e["code"] for e in o.s.errors] + v
                                                       if k == "enum_codes" else v)
               for k, v in out.items()}
    if "properties" in out:
        props = {}
        for name, sub in out["properties"].items():
            if not isinstance(sub, dict):
                raise SchemaError(f"{where}: property {name} must be a schema")
            if _on(sub, surface):
                props[name] = _schema(o, sub, surface, f"{where}.{name}")
        out["properties"] = props
        for name in out.get("required", []):
            if name not in props:
                raise SchemaError(f"{where}: required {name} is not a property on {surface}")
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _schema(o, out[key], surface, f"{where}.{key}")
    if "allOf" in out:
        out["allOf"] = [_schema(o, sub, surface, f"{where}.allOf") for sub in out["allOf"]]
    if surface == "mcp":
        for key in OPS_MCP_DROPS:
            out.pop(key, None)
        if "allOf" in out:
            #  MCP wants one object schema: the parts' properties and required merged.
            props, required = {}, []
            for part in out.pop("allOf"):
                if part.get("type") != "object":
                    raise SchemaError(f"{where}: allOf merges object schemas only")
                props.update(part.get("properties", {}))
                required += [r for r in part.get("required", []) if r not in required]
            out = {"type": "object", **out, "properties": props}
            if required:
                out["required"] = required
    return out



#  -- MCP's wording: mustache-like templates (gateway/gw_text.c renders them) ---------------
#  {x} a field of the answer, {x:fmt} formatted, {@a} an argument (its default when not
#  given), {#x}...{/x} once per element of an array (or once when x is set), {?x}...{/x}
#  once when x is set, {^x}...{/x} once when it is not (absent, null, false, "" or []),
#  {>name} a text of components.texts. Formats: chomp, mib, signal, words.TABLE,
#  plural.ONE.MANY, or.TEXT, cut.N (the first line, at most N bytes, … when cut).

TEXT_TOKEN_RE = re.compile(r"\{([#?^/>@]?)([A-Za-z][A-Za-z0-9]*)(?::([^{}]*))?\}")
TEXT_FORMATS = ("chomp", "mib", "signal", "words", "plural", "or", "cut")


def _expand(o, text, where, seen=()):
    def sub(m):
        if m.group(1) != ">":
            return m.group(0)
        name = m.group(2)
        if name not in o.texts or name in seen:
            raise SchemaError(f"{where}: no text {name} (or it includes itself)")
        return _expand(o, o.texts[name], where, seen + (name,))
    return TEXT_TOKEN_RE.sub(sub, text)


def _props(o, schema):
    if not isinstance(schema, dict):
        return {}
    return schema.get("properties", {})


def op_text(o, op):
    """The operation's MCP text with texts included, checked against its answer's fields
    and its arguments; None for an operation MCP does not have."""
    if "mcp" not in op["surfaces"]:
        return None
    where = f"operation {op['name']}: text"
    text = op.get("text")
    if not isinstance(text, str) or not text:
        raise SchemaError(f"{where}: an MCP tool needs a text (how its answer is worded)")
    text = _expand(o, text, where)
    args = {a["name"] for a in op_args(o, op, "mcp")}
    stack = [(None, _props(o, _output(o, op, "mcp")))]
    pos = 0
    for m in TEXT_TOKEN_RE.finditer(text):
        if "{" in text[pos:m.start()] or "}" in text[pos:m.start()]:
            raise SchemaError(f"{where}: a brace that is not a {{field}} near {text[pos:m.start()]!r}")
        pos = m.end()
        kind, name, fmt = m.group(1), m.group(2), m.group(3)
        fields = stack[-1][1]
        if kind == "@":
            if name not in args:
                raise SchemaError(f"{where}: {{@{name}}}: {op['name']} has no argument {name}")
        elif kind == "/":
            if stack[-1][0] != name:
                raise SchemaError(f"{where}: {{/{name}}} closes what it did not open")
            stack.pop()
            continue
        elif name not in fields:
            raise SchemaError(f"{where}: {{{kind}{name}}}: the answer has no field {name}")
        if kind in "#?^" and kind:
            inner = fields
            if kind == "#" and fields[name].get("type") == "array":
                items = fields[name].get("items", {})
                inner = _props(o, items)
            stack.append((name, inner))
        if fmt is not None:
            head = fmt.split(".")[0]
            if head not in TEXT_FORMATS or (head == "words" and fmt[6:] not in o.words) or \
                    (head == "plural" and len(fmt.split(".")) != 3) or \
                    (head == "cut" and not fmt[4:].isdigit()):
                raise SchemaError(f"{where}: {{{name}:{fmt}}}: formats are {', '.join(TEXT_FORMATS)}")
    if "{" in text[pos:] or "}" in text[pos:]:
        raise SchemaError(f"{where}: a brace that is not a {{field}} near {text[pos:]!r}")
    if len(stack) != 1:
        raise SchemaError(f"{where}: {{#{stack[-1][0]}}} is never closed")
    return text


#  -- MCP ---------------------------------------------------------------------------------

def _undescribed(node):
    #  An output schema without its descriptions: tools/list goes into every model's
    #  context, and the answer's fields speak for themselves (REST's document keeps them).
    if isinstance(node, dict):
        return {k: _undescribed(v) for k, v in node.items()
                if k != "description" or not isinstance(v, str)}
    if isinstance(node, list):
        return [_undescribed(v) for v in node]
    return node


def gen_tools(o):
    """tools/list's tools: name, title, description, inputSchema, outputSchema, annotations."""
    tools = []
    for op in o.ops:
        if "mcp" not in op["surfaces"]:
            continue
        args = op_args(o, op, "mcp")
        schema = {"type": "object", "properties": {a["name"]: a["schema"] for a in args},
                  "additionalProperties": False}
        required = [a["name"] for a in args if a["required"]]
        if required:
            schema["required"] = required
        tools.append({"name": op["name"], "title": op["title"], "description": op["description"],
                      "inputSchema": schema, "outputSchema": _undescribed(_output(o, op, "mcp")),
                      "annotations": {"title": op["title"], **op["annotations"]}})
    return tools


#  -- REST: docs/openapi.json ---------------------------------------------------------------

def _param(a):
    p = {"name": a["name"], "in": a["in"]}
    if a["in"] == "path" or a["required"]:
        p["required"] = True
    schema = dict(a["schema"])
    if "description" in schema:
        p["description"] = schema.pop("description")
    p["schema"] = schema
    return p


def _json_content(schema, media="application/json"):
    return {media: {"schema": schema}}


def gen_openapi(o):
    frame = o.doc["openapi"]
    bodies = {}
    paths = {}
    for op in o.ops:
        if "rest" not in op["surfaces"]:
            continue
        r = op["rest"]
        args = op_args(o, op, "rest")
        item = paths.setdefault(r["path"], {"parameters": [], "ops": {}})
        obj = {"summary": r["summary"], "operationId": r["operationId"]}
        for key in ("tags", "description", "security"):
            if key in r:
                obj[key] = r[key]
        obj["parameters"] = [_param(a) for a in args if a["in"] == "query"]
        body = r.get("body")
        if body is not None:
            if "schema" in body:
                schema = _schema(o, body["schema"], "rest", f"operation {op['name']}: body")
            else:
                body_args = [a for a in args if a["in"] == "body"]
                schema = {"type": "object", "additionalProperties": False}
                if "minProperties" in body:
                    schema["minProperties"] = body["minProperties"]
                required = [a["name"] for a in body_args if a["required"]]
                if required:
                    schema["required"] = required
                schema["properties"] = {a["name"]: a["schema"] for a in body_args}
                if "name" in body:
                    bodies[body["name"]] = schema
                    schema = {"$ref": f"#/components/schemas/{body['name']}"}
            obj["requestBody"] = {"required": body["required"],
                                  "content": _json_content(schema, body.get("media", "application/json"))}
        success = r["success"]
        ok = {"description": success["description"]}
        if "headers" in success:
            ok["headers"] = success["headers"]
        if "websocket" in success:
            #  OpenAPI has no words for WebSocket messages: the 101 names the headers, and
            #  x-sbx-websocket lists each message either side sends.
            ws = success["websocket"]
            obj["parameters"] += [
                {"name": "Upgrade", "in": "header", "required": True, "schema": {"type": "string", "enum": ["websocket"]}},
                {"name": "Connection", "in": "header", "required": True, "schema": {"type": "string"},
                 "description": "Upgrade (among its tokens)."},
                {"name": "Sec-WebSocket-Version", "in": "header", "required": True,
                 "schema": {"type": "string", "enum": ["13"]}},
                {"name": "Sec-WebSocket-Key", "in": "header", "required": True, "schema": {"type": "string"},
                 "description": "RFC 6455: base64 of 16 random bytes."}]
            ok["headers"] = {"Upgrade": {"schema": {"type": "string", "enum": ["websocket"]}},
                             "Sec-WebSocket-Accept": {"schema": {"type": "string"}}}
            sides = {}
            for side in ("client", "server"):
                sides[side] = {}
                for name, m in ws[side].items():
                    sides[side][name] = {"description": m["description"], "frame": m["frame"]}
                    if "schema" in m:
                        sides[side][name]["schema"] = _schema(o, m["schema"], "rest",
                                                              f"operation {op['name']}: message {name}")
            ok["x-sbx-websocket"] = {"description": ws["description"], "client": sides["client"],
                                     "server": sides["server"]}
        else:
            schema = (_schema(o, success["schema"], "rest", f"operation {op['name']}: success")
                      if "schema" in success else _output(o, op, "rest"))
            ok["content"] = _json_content(schema, success.get("media", "application/json"))
        if "stream" in success:
            #  The same answer as Server-Sent Events when asked for (Accept): OpenAPI has
            #  no words for each event, so they are listed beside the schema.
            stream = success["stream"]
            events = {}
            for name, event in stream["events"].items():
                events[name] = {"description": event["description"]}
                if "schema" in event:
                    events[name]["schema"] = _schema(o, event["schema"], "rest",
                                                     f"operation {op['name']}: event {name}")
            ok["content"]["text/event-stream"] = {
                "schema": {"type": "string", "description": stream["description"]},
                "x-sbx-events": events}
        responses = {str(success["status"]): ok}
        for status, extra in r.get("responses", {}).items():
            responses[status] = {"description": extra["description"],
                                 "content": _json_content(_schema(o, extra["schema"], "rest",
                                                                  f"operation {op['name']}"))}
        for name in r["errors"]:
            responses[str(o.responses[name]["status"])] = {"$ref": f"#/components/responses/{name}"}
        obj["responses"] = dict(sorted(responses.items()))
        for a in args:
            if a["in"] == "path":
                p = _param(a)
                known = [x for x in item["parameters"] if x["name"] == p["name"]]
                if known and known[0] != p:
                    raise SchemaError(f"{r['path']}: {{{p['name']}}} is described differently "
                                      f"by {op['name']}")
                if not known:
                    item["parameters"].append(p)
        item["ops"][r["method"].lower()] = obj
    out_paths = {}
    for path, item in paths.items():
        ops = item["ops"]
        params = sorted(item["parameters"], key=lambda p: path.index("{" + p["name"] + "}"))
        #  A query parameter every operation of the path takes alike belongs to the path.
        if len(ops) > 1:
            first = next(iter(ops.values()))["parameters"]
            for p in list(first):
                if all(p in obj["parameters"] for obj in ops.values()):
                    params.append(p)
                    for obj in ops.values():
                        obj["parameters"].remove(p)
        out = {"parameters": params} if params else {}
        for method in OPS_METHODS:
            obj = ops.get(method.lower())
            if obj is None:
                continue
            if not obj["parameters"]:
                del obj["parameters"]
            out[method.lower()] = obj
        out_paths[path] = out
    shared = {}
    for name, r in o.responses.items():
        resp = {"description": r["description"],
                "content": _json_content({"$ref": "#/components/schemas/Error"})}
        if "headers" in r:
            resp["headers"] = r["headers"]
        shared[name] = resp
    schemas = {name: _schema(o, shape, "rest", f"schema {name}") for name, shape in o.shapes.items()}
    schemas.update(bodies)
    doc = {k: frame[k] for k in frame}
    doc["paths"] = out_paths
    doc["components"] = {"securitySchemes": o.doc["components"]["securitySchemes"],
                         "schemas": schemas, "responses": shared}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


#  -- C: the dispatch table and the tool list ------------------------------------------------

def _op_const(op):
    return "SBX_OP_" + cconst(op["name"])


def rest_routes(o):
    """(method, path, op) in path order of first use, a path's methods in OPS_METHODS order."""
    order = []
    for op in o.ops:
        if "rest" in op["surfaces"] and op["rest"]["path"] not in order:
            order.append(op["rest"]["path"])
    routes = [(op["rest"]["method"], op["rest"]["path"], op) for op in o.ops if "rest" in op["surfaces"]]
    return sorted(routes, key=lambda r: (order.index(r[1]), OPS_METHODS.index(r[0])))



ARG_TYPES = ("string", "integer", "boolean", "object", "null", "array")


def op_arguments(o, op):
    """The operation's arguments once, across its surfaces: a dict per argument with its
    schema (the same on every surface that takes it: the build fails otherwise), where
    REST takes it and whether each surface requires it."""
    views = {s: {a["name"]: a for a in op_args(o, op, s)} for s in op["surfaces"]}
    order = []
    for s in op["surfaces"]:
        order += [n for n in views[s] if n not in order]
    out = []
    for name in order:
        on = [s for s in op["surfaces"] if name in views[s]]
        schemas = [dict(views[s][name]["schema"]) for s in on]
        for sch in schemas:
            sch.pop("description", None)
            for key in OPS_MCP_DROPS:
                sch.pop(key, None)
        if any(sch != schemas[0] for sch in schemas):
            raise SchemaError(f"operation {op['name']}: argument {name} has other limits on "
                              f"{' and '.join(on)}: one definition serves both doors")
        rest_view = views.get("rest", {}).get(name)
        schema = (rest_view or views[on[0]][name])["schema"]
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if any(x not in ARG_TYPES for x in types):
            raise SchemaError(f"operation {op['name']}: argument {name}: types are {ARG_TYPES}")
        values = []
        if "object" in types:
            ap = schema.get("additionalProperties", {})
            values = ap.get("type", []) if isinstance(ap, dict) else []
            values = values if isinstance(values, list) else [values]
        if "array" in types:
            values = schema.get("items", {}).get("type", [])
            values = values if isinstance(values, list) else [values]
        #  What the argument says before a surface's difference: REST's required, also on
        #  an operation REST does not have.
        base = next(_arg(o, raw, op["name"]) for raw in op["arguments"]
                    if name in (_arg(o, raw, op["name"]).get("name"),
                                _arg(o, raw, op["name"]).get("mcp", {}).get("name")))
        out.append({"name": name, "surfaces": on, "in": rest_view["in"] if rest_view else None,
                    "base_required": base.get("required", False),
                    "types": types, "values": values, "schema": schema,
                    "required": {s: views[s][name]["required"] for s in on}})
    return out


def _c_str(text):
    return "NULL" if text is None else '"' + "".join(_c_units(text)) + '"'


def _arg_ident(op, a):
    return f"s_{op['name']}_{cconst(a['name']).lower()}"


def gen_ops_header(o):
    w = []
    w.append(f"//  GENERATED by {GENERATOR} from schemas/operations.json - do not edit: change the")
    w.append(f"//  operations and run `python3 {GENERATOR}`. What gw_rest routes and gw_tools")
    w.append("//  dispatches; their handlers are hand-written, switched on sbx_op_t.")
    w.append("#ifndef SBX_OPS_GEN_H_INCLUDED")
    w.append("#define SBX_OPS_GEN_H_INCLUDED")
    w.append("")
    w.append("#include <stdbool.h>")
    w.append("#include <stdint.h>")
    w.append("")
    w.append('#include "sbx_msg.h"')
    w.append("")
    w.append("//  The operations, in the order of schemas/operations.json.")
    w.append("typedef enum {")
    rows = []
    for op in o.ops:
        doors = ["MCP"] if "mcp" in op["surfaces"] else []
        if "rest" in op["surfaces"]:
            doors.append(f"{op['rest']['method']} {op['rest']['path']}")
        rows.append((f"{_op_const(op)},", f"{op['name']}: {', '.join(doors)}"))
    w.extend(aligned(rows))
    w.append("} sbx_op_t;")
    w.append(f"#define SBX_OP__COUNT {len(o.ops)}")
    w.append("")
    w.append("//  The surfaces (doors) an operation or argument is on.")
    w.append("#define SBX_OPS_MCP  1")
    w.append("#define SBX_OPS_REST 2")
    w.append("")
    w.append("//  Where REST takes an argument from; NONE: MCP only.")
    w.append("typedef enum { SBX_ARG_IN_NONE, SBX_ARG_IN_PATH, SBX_ARG_IN_QUERY, SBX_ARG_IN_BODY } sbx_arg_in_t;")
    w.append("")
    w.append("//  REST's request body: none, a JSON object of the body arguments (optional or")
    w.append("//  required), or raw bytes (write_file's file).")
    w.append("typedef enum {")
    w.append("    SBX_OPS_BODY_NONE,")
    w.append("    SBX_OPS_BODY_JSON,")
    w.append("    SBX_OPS_BODY_JSON_REQUIRED,")
    w.append("    SBX_OPS_BODY_RAW")
    w.append("} sbx_ops_body_t;")
    w.append("")
    w.append("//  JSON types an argument (or an object argument's values, an array's items) may have.")
    w.append("#define SBX_ARG_STRING  1")
    w.append("#define SBX_ARG_INTEGER 2")
    w.append("#define SBX_ARG_BOOLEAN 4")
    w.append("#define SBX_ARG_OBJECT  8")
    w.append("#define SBX_ARG_NULL    16")
    w.append("#define SBX_ARG_ARRAY   32")
    w.append("")
    w.append("//  One argument of an operation, the same on every surface (the generator refuses")
    w.append("//  other limits on one door): what sbx_args checks and takes defaults from.")
    w.append("typedef struct {")
    w.extend(aligned([
        ("const char *name;", "as both doors name it (REST: path parameter, query or body key)"),
        ("unsigned surfaces;", "SBX_OPS_MCP | SBX_OPS_REST"),
        ("sbx_arg_in_t in;", "where REST takes it"),
        ("unsigned types;", "SBX_ARG_* it may be"),
        ("unsigned values;", "an object's values or an array's items: SBX_ARG_* they may be"),
        ("bool required;", "on REST (and MCP unless mcp_optional)"),
        ("bool mcp_optional;", "MCP may leave it out (the session's default sandbox)"),
        ("bool has_min, has_max;", "integer bounds"),
        ("int64_t min, max;", ""),
        ("int64_t min_length, max_length;", "string length in characters; max -1: none"),
        ("const char *pattern;", "a POSIX extended regular expression, or NULL"),
        ("const char *const *choices;", "enum: NULL-terminated, or NULL"),
        ("const char *dflt;", "the default as JSON text, or NULL"),
    ]))
    w.append("} sbx_op_arg_t;")
    w.append("")
    w.append("typedef struct {")
    w.extend(aligned([
        ("const char *name;", "the operation, and the MCP tool's name when tool"),
        ("bool tool;", "an MCP tool: one of sbx_ops_tools_json"),
        ("const char *method;", "its REST route, or NULL when REST has none"),
        ("const char *path;", "as in docs/openapi.json: {x} takes one path segment"),
        ("bool read_only;", "readOnlyHint: a read-only key may use it (REST: the GETs)"),
        ("bool destructive;", "destructiveHint"),
        ("sbx_msg_type_t message;", "the request it becomes; SBX_MSG__UNKNOWN: the gateway answers"),
        ("uint32_t deadline_ms;", "the wait for the answer (a waited exec adds its timeout)"),
        ("sbx_ops_body_t rest_body;", "what REST's request body is"),
        ("const char *text;", "MCP's wording of the answer (gw_text), or NULL"),
        ("const sbx_op_arg_t *args;", "its arguments, arg_count of them"),
        ("unsigned arg_count;", ""),
    ]))
    w.append("} sbx_op_info_t;")
    w.append("")
    w.append("extern const sbx_op_info_t sbx_ops[SBX_OP__COUNT];")
    w.append("")
    w.append("//  The REST routes, a path's methods in the order an Allow header lists them; the")
    w.append("//  last has method NULL.")
    w.append("typedef struct {")
    w.append("    const char *method;")
    w.append("    const char *path;")
    w.append("    sbx_op_t op;")
    w.append("} sbx_ops_route_t;")
    w.append("extern const sbx_ops_route_t sbx_ops_routes[];")
    w.append("")
    w.append("//  The operation of the MCP tool called name: 0, or -1 when no tool has that name.")
    w.append("int sbx_ops_tool (const char *name, sbx_op_t *op_p);")
    w.append("")
    w.append("//  tools/list's tools (name, title, description, inputSchema, outputSchema,")
    w.append("//  annotations): a JSON array, as text.")
    w.append("extern const char sbx_ops_tools_json[];")
    w.append("")
    w.append("//  The word tables texts name ({state:words.sandboxState}): a JSON object, as text.")
    w.append("extern const char sbx_ops_words_json[];")
    w.append("")
    w.append("#endif")
    return "\n".join(w) + "\n"


def _c_units(text):
    #  text as C string pieces: one escape or one character each (never split one).
    units = []
    for i, c in enumerate(text):
        if c in "\\\"":
            units.append("\\" + c)
        elif c == "?" and text[i + 1:i + 2] == "?":
            units.append("\\?")  # no trigraphs
        elif c == "\n" or ord(c) < 0x20:
            units.append(f"\\{ord(c):03o}")
        else:
            units.append(c)
    return units


def _c_string_lines(text, indent="    ", width=90):
    #  Adjacent literals of at most width, broken after a comma, else after a space.
    lines, cur, size = [], [], 0
    for u in _c_units(text):
        cur.append(u)
        size += len(u)
        if size >= width or (u == "," and size >= width - 20) or (u == " " and size >= width - 8):
            lines.append(f'{indent}"{"".join(cur)}"')
            cur, size = [], 0
    if cur:
        lines.append(f'{indent}"{"".join(cur)}"')
    return lines


def gen_ops_source(o):
    w = []
    w.append(f"//  GENERATED by {GENERATOR} from schemas/operations.json - do not edit: change the")
    w.append(f"//  operations and run `python3 {GENERATOR}`.")
    w.append('#include "sbx_ops_gen.h"')
    w.append("")
    w.append("#include <string.h>")
    w.append("")
    for op in o.ops:
        args = op_arguments(o, op)
        for a in args:
            if a["schema"].get("enum"):
                choices = ", ".join(_c_str(c) for c in a["schema"]["enum"])
                w.append(f"static const char *const {_arg_ident(op, a)}_choices[] = {{{choices}, NULL}};")
        if not args:
            continue
        w.append(f"static const sbx_op_arg_t s_{op['name']}_args[] = {{")
        for a in args:
            sch = a["schema"]
            surf = " | ".join(f"SBX_OPS_{s.upper()}" for s in a["surfaces"])
            where = f"SBX_ARG_IN_{a['in'].upper()}" if a["in"] else "SBX_ARG_IN_NONE"
            types = " | ".join(f"SBX_ARG_{x.upper()}" for x in a["types"])
            values = " | ".join(f"SBX_ARG_{x.upper()}" for x in a["values"]) or "0"
            req = a["required"].get("rest", a["base_required"]) or any(a["required"].values())
            mcp_optional = req and a["required"].get("mcp") is False
            lo, hi = sch.get("minimum"), sch.get("maximum")
            dflt = json.dumps(sch["default"], ensure_ascii=False) if "default" in sch else None
            choices = f"{_arg_ident(op, a)}_choices" if sch.get("enum") else "NULL"
            w.append(f"    {{{_c_str(a['name'])}, {surf}, {where}, {types}, {values}, "
                     f"{'true' if req else 'false'}, {'true' if mcp_optional else 'false'},")
            w.append(f"     {'true' if lo is not None else 'false'}, {'true' if hi is not None else 'false'}, "
                     f"{lo or 0}LL, {hi or 0}LL, {sch.get('minLength', 0)}, {sch.get('maxLength', -1)}, "
                     f"{_c_str(sch.get('pattern'))}, {choices}, {_c_str(dflt)}}},")
        w.append("};")
    w.append("")
    w.append("const sbx_op_info_t sbx_ops[SBX_OP__COUNT] = {")
    for op in o.ops:
        rest = op.get("rest") if "rest" in op["surfaces"] else None
        method = f'"{rest["method"]}"' if rest else "NULL"
        path = f'"{rest["path"]}"' if rest else "NULL"
        notes = op["annotations"]
        message = f"SBX_MSG_{cconst(op['message'])}" if op["message"] else "SBX_MSG__UNKNOWN"
        head = f"    [{_op_const(op)}] = {{"
        w.append(f'{head}"{op["name"]}", {"true" if "mcp" in op["surfaces"] else "false"}, '
                 f"{method}, {path},")
        w.append(f"{' ' * len(head)}{'true' if notes['readOnlyHint'] else 'false'}, "
                 f"{'true' if notes.get('destructiveHint') else 'false'}, {message}, "
                 f"{op.get('deadline_ms', 0)},")
        count = len(op_arguments(o, op))
        body = rest.get("body") if rest else None
        kind = ("NONE" if body is None else "RAW" if "schema" in body
                else "JSON_REQUIRED" if body["required"] else "JSON")
        text = op_text(o, op)
        w.append(f"{' ' * len(head)}SBX_OPS_BODY_{kind},")
        if text is not None:
            w.extend(_c_string_lines(text, indent=" " * len(head)))
            w[-1] += ","
        else:
            w.append(f"{' ' * len(head)}NULL,")
        w.append(f"{' ' * len(head)}{'s_' + op['name'] + '_args' if count else 'NULL'}, {count}}},")
    w.append("};")
    w.append("")
    w.append("const sbx_ops_route_t sbx_ops_routes[] = {")
    for method, path, op in rest_routes(o):
        w.append(f'    {{"{method}", "{path}", {_op_const(op)}}},')
    w.append("    {NULL, NULL, 0}};")
    w.append("")
    w.append("int sbx_ops_tool (const char *name, sbx_op_t *op_p)")
    w.append("{")
    w.append("    for (int op = 0; name && op < SBX_OP__COUNT; op++)")
    w.append("        if (sbx_ops[op].tool && strcmp (sbx_ops[op].name, name) == 0) {")
    w.append("            if (op_p)")
    w.append("                *op_p = (sbx_op_t) op;")
    w.append("            return 0;")
    w.append("        }")
    w.append("    return -1;")
    w.append("}")
    w.append("")
    w.append("const char sbx_ops_words_json[] =")
    w.extend(_c_string_lines(json.dumps(o.words, ensure_ascii=False, separators=(",", ":"))))
    w[-1] += ";"
    w.append("")
    w.append("const char sbx_ops_tools_json[] =")
    tools = gen_tools(o)
    w.append('    "["')
    for i, tool in enumerate(tools):
        w.append(f"    //  {tool['name']}")
        text = json.dumps(tool, ensure_ascii=False, separators=(",", ":"))
        w.extend(_c_string_lines(text + ("," if i + 1 < len(tools) else "")))
    w.append('    "]";')
    return "\n".join(w) + "\n"


#  -- The differences between the doors ---------------------------------------------------

def _describe(override):
    parts = []
    for k, v in override.items():
        if v is None:
            parts.append(f"no {k}")
        elif k == "description":
            parts.append("its own description")
        else:
            parts.append(f"{k} {json.dumps(v, ensure_ascii=False)}")
    return ", ".join(parts)


def _schema_drift(node, where, lines):
    if not isinstance(node, dict):
        return
    if "surfaces" in node:
        lines.append(f"{where}: {' and '.join(node['surfaces'])} only")
    for surface in OPS_SURFACES:
        if surface in node and isinstance(node[surface], dict):
            what = _describe(node[surface]) if "output" not in node[surface] else "its own output"
            lines.append(f"{where}: {surface}: {what}")
    for name, sub in node.get("properties", {}).items():
        _schema_drift(sub, f"{where}.{name}", lines)
    for key in ("items", "additionalProperties"):
        _schema_drift(node.get(key), f"{where}.{key}", lines)
    for i, sub in enumerate(node.get("allOf", [])):
        _schema_drift(sub, f"{where}.allOf[{i}]", lines)


def _arg_drift(arg, where, both, lines):
    if "surfaces" in arg and both:
        lines.append(f"{where}: {' and '.join(arg['surfaces'])} only" +
                     (f": {arg['drift']}" if arg.get("drift") else ""))
    elif arg.get("drift"):
        lines.append(f"{where}: {arg['drift']}")
    for surface in OPS_SURFACES:
        if arg.get(surface):
            lines.append(f"{where}: {surface}: {_describe(arg[surface])}")


def drift(o):
    """Every difference between MCP and REST that operations.json records, one a line;
    a shared argument's own once, then what each use adds."""
    lines = []
    for name, shape in o.shapes.items():
        _schema_drift(shape, f"schema {name}", lines)
    for name, arg in o.arguments.items():
        _arg_drift(arg, f"argument {name}", True, lines)
    for op in o.ops:
        where = op["name"]
        both = len(op["surfaces"]) == 2
        if not both:
            lines.append(f"{where}: {op['surfaces'][0]} only" + (f": {op['drift']}" if op.get("drift") else ""))
        elif op.get("drift"):
            lines.append(f"{where}: {op['drift']}")
        if "output" in op.get("mcp", {}):
            lines.append(f"{where}: mcp: its own output schema")
        if both and "schema" in op["rest"]["success"]:
            lines.append(f"{where}: rest: answers {op['rest']['success'].get('media', 'its own schema')}")
        _schema_drift(op.get("output"), f"{where}: output", lines)
        for raw in op.get("arguments", []):
            name = _arg(o, raw, where)["name"]
            if "ref" in raw:
                raw = {k: v for k, v in raw.items() if k != "drift" or v is not None}
                #  A use that undoes its shared argument's difference adds none.
                views = [op_args(o, {**op, "arguments": [raw]}, s) for s in OPS_SURFACES]
                if both and views[0] == views[1]:
                    raw = {k: v for k, v in raw.items() if k not in OPS_SURFACES}
            _arg_drift(raw, f"{where}.{name}", both, lines)
    return lines


# ---------------------------------------------------------------------------------------
#  State machines (schemas/lifecycle.json): one description, the C tables of every
#  process that keeps one, and their reference.
#
#  A machine has states (an enum of the schemas, or its own list: the first is where it
#  starts), events, and transitions: in state `from`, on event `on`, it goes `to` (the
#  same state when left out), asks another process for a message (`ask`), performs
#  actions (`do`, codes for the process to carry out, in order) and then fires an event
#  (`then`). `from` and `on` may be lists: one row each. A sub-machine names its parent
#  (`within`) and shares its events and actions. A (state, event) with no row is refused:
#  the process answers a request with failed_precondition and ignores anything else.

EVENT_KINDS = ("notice", "request", "failure", "periodic")


def _load_machines(s, fname, machines):
    if not isinstance(machines, dict):
        raise SchemaError(f"{fname}: \"machines\" must be an object")
    for name, m in machines.items():
        where = f"{fname}: machine {name}"
        if not isinstance(name, str) or not ENUM_RE.match(name):
            raise SchemaError(f"{where}: bad machine name (lower_case)")
        if name in s.machines:
            raise SchemaError(f"{where}: defined twice")
        if not isinstance(m, dict):
            raise SchemaError(f"{where}: must be an object")
        _only(m, ("doc", "within", "states", "state_docs", "events", "actions", "transitions"),
              where)
        within = m.get("within")
        if within is not None and not isinstance(within, str):
            raise SchemaError(f"{where}: \"within\" must name a machine")
        if within is not None and ("events" in m or "actions" in m):
            raise SchemaError(f"{where}: a sub-machine uses the events and actions of {within}")
        mach = {"name": name, "file": fname, "where": where, "doc": _need(m, "doc", str, where),
                "within": within, "states_raw": m.get("states"),
                "state_docs": m.get("state_docs", {}),
                "events": [], "actions": [], "groups": [], "rows": []}
        for key in ("events", "actions"):
            items = m.get(key, [])
            if not isinstance(items, list):
                raise SchemaError(f"{where}: \"{key}\" must be a list")
            seen = set()
            for i, item in enumerate(items):
                iw = f"{where}: {key}[{i}]"
                if not isinstance(item, dict):
                    raise SchemaError(f"{iw}: must be an object")
                _only(item, ("name", "kind", "doc") if key == "events" else ("name", "doc"), iw)
                iname = _need(item, "name", str, iw)
                if not ENUM_RE.match(iname) or iname in seen:
                    raise SchemaError(f"{iw}: bad or repeated name '{iname}'")
                seen.add(iname)
                entry = {"name": iname, "doc": _need(item, "doc", str, iw)}
                if key == "events":
                    entry["kind"] = item.get("kind", "notice")
                    if entry["kind"] not in EVENT_KINDS:
                        raise SchemaError(f"{iw}: kind must be one of {', '.join(EVENT_KINDS)}")
                mach[key].append(entry)
        if within is None and not mach["events"]:
            raise SchemaError(f"{where}: no events")
        transitions = _need(m, "transitions", list, where)
        if not transitions:
            raise SchemaError(f"{where}: no transitions")
        for i, t in enumerate(transitions):
            tw = f"{where}: transitions[{i}]"
            if not isinstance(t, dict):
                raise SchemaError(f"{tw}: must be an object")
            _only(t, ("from", "on", "to", "ask", "do", "then", "doc"), tw)
            group = {}
            for key in ("from", "on"):
                value = _need(t, key, (str, list), tw)
                value = [value] if isinstance(value, str) else value
                if not value or not all(isinstance(x, str) and x for x in value):
                    raise SchemaError(f"{tw}: \"{key}\" must be a name or a list of names")
                if len(set(value)) != len(value):
                    raise SchemaError(f"{tw}: \"{key}\" names one twice")
                group[key] = value
            for key in ("to", "ask", "then", "doc"):
                if key in t and not (isinstance(t[key], str) and t[key].strip()):
                    raise SchemaError(f"{tw}: \"{key}\" must be a non-empty string")
                group[key] = t.get(key)
            do = t.get("do", [])
            if not isinstance(do, list) or not all(isinstance(x, str) and x for x in do):
                raise SchemaError(f"{tw}: \"do\" must be a list of action names")
            group["do"] = do
            group["where"] = tw
            mach["groups"].append(group)
            for state in group["from"]:
                for event in group["on"]:
                    mach["rows"].append({"from": state, "on": event, "to": group["to"] or state,
                                         "ask": group["ask"], "do": do, "then": group["then"],
                                         "where": tw})
        s.machines[name] = mach


def _validate_machines(s, idents):
    def claim(ident, origin):
        if ident in RESERVED_IDENTS or ident in idents:
            raise SchemaError(f"{origin}: generates {ident}, as does "
                              f"{idents.get(ident, 'sbx_msg.h')}")
        idents[ident] = origin

    claim("sbx_lifecycle_kind_t", "the machines")
    for kind in EVENT_KINDS:
        claim(f"SBX_LIFECYCLE_{cconst(kind)}", "the machines")
    for m in s.machines.values():
        where = m["where"]
        root = m
        if m["within"] is not None:
            root = s.machines.get(m["within"])
            if root is None or root["within"] is not None or root is m:
                raise SchemaError(f"{where}: within '{m['within']}' is not a machine of its own")
            m["cname"] = f"{root['name']}_{m['name']}"
        else:
            m["cname"] = m["name"]
        m["root"] = root
        raw = m["states_raw"]
        if isinstance(raw, str):
            if raw not in s.enums:
                raise SchemaError(f"{where}: states: unknown enum '{raw}'")
            if m["within"] is not None:
                raise SchemaError(f"{where}: a sub-machine has states of its own (idle first)")
            m["enum"] = raw
            m["states"] = [{"name": v, "doc": ""} for v in s.enums[raw]["values"]]
            m["state_type"] = f"sbx_{raw}_t"
            m["state_const"] = lambda v, raw=raw: f"SBX_{cconst(raw)}_{cconst(v)}"
        elif isinstance(raw, list) and raw:
            m["enum"] = None
            m["states"] = []
            for i, st in enumerate(raw):
                sw = f"{where}: states[{i}]"
                if not isinstance(st, dict):
                    raise SchemaError(f"{sw}: must be an object")
                _only(st, ("name", "doc"), sw)
                sname = _need(st, "name", str, sw)
                if not ENUM_RE.match(sname) or any(x["name"] == sname for x in m["states"]):
                    raise SchemaError(f"{sw}: bad or repeated state name '{sname}'")
                m["states"].append({"name": sname, "doc": _need(st, "doc", str, sw)})
            m["state_type"] = f"sbx_{m['cname']}_state_t"
            m["state_const"] = lambda v, c=m["cname"]: f"SBX_{cconst(c)}_{cconst(v)}"
        else:
            raise SchemaError(f"{where}: \"states\" must name an enum or list the states")
        names = [x["name"] for x in m["states"]]
        if not isinstance(m["state_docs"], dict):
            raise SchemaError(f"{where}: \"state_docs\" must be an object")
        for state, doc in m["state_docs"].items():
            if state not in names or not (isinstance(doc, str) and doc.strip()):
                raise SchemaError(f"{where}: state_docs: '{state}' is no state, or has no doc")
        for st in m["states"]:
            st["doc"] = m["state_docs"].get(st["name"], st["doc"])
        events = {e["name"]: e for e in root["events"]}
        actions = {a["name"] for a in root["actions"]}
        seen = {}
        for r in m["rows"]:
            rw = r["where"]
            for key in ("from", "to"):
                if r[key] not in names:
                    raise SchemaError(f"{rw}: '{r[key]}' is not a state of {m['name']}")
            for key in ("on", "then"):
                if r[key] is not None and r[key] not in events:
                    raise SchemaError(f"{rw}: '{r[key]}' is not an event of {root['name']}")
            if r["then"] is not None and events[r["then"]]["kind"] == "request":
                raise SchemaError(f"{rw}: then '{r['then']}' is a request: those come from outside")
            if (r["do"] or r["then"]) and not actions:
                raise SchemaError(f"{rw}: {root['name']} declares no actions")
            for a in r["do"]:
                if a not in actions:
                    raise SchemaError(f"{rw}: '{a}' is not an action of {root['name']}")
            if r["ask"] is not None and (r["ask"] not in s.types or s.types[r["ask"]]["msg"] is None):
                raise SchemaError(f"{rw}: ask '{r['ask']}' is not a message")
            key = (r["from"], r["on"])
            if key in seen:
                raise SchemaError(f"{rw}: {r['from']} on {r['on']} is given already ({seen[key]})")
            seen[key] = rw
        m["has_ask"] = any(r["ask"] for r in m["rows"])
        m["has_actions"] = bool(root["actions"])
        origin = where
        if m["enum"] is None:
            claim(m["state_type"], origin)
            claim(f"sbx_{m['cname']}_state_name", origin)
            claim(f"SBX_{cconst(m['cname'])}__COUNT", origin)
            for st in m["states"]:
                claim(m["state_const"](st["name"]), origin)
        for ident in (f"sbx_{m['cname']}_transition_t", f"sbx_{m['cname']}_transitions",
                      f"sbx_{m['cname']}_transition", f"SBX_{cconst(m['cname'])}_TRANSITIONS"):
            claim(ident, origin)
        if root is m:
            c, cu = m["cname"], cconst(m["cname"])
            for ident in (f"sbx_{c}_event_t", f"sbx_{c}_event_name", f"sbx_{c}_event_kind",
                          f"SBX_{cu}_EV__NONE", f"SBX_{cu}_EV__COUNT"):
                claim(ident, origin)
            for e in m["events"]:
                claim(f"SBX_{cu}_EV_{cconst(e['name'])}", origin)
            if m["actions"]:
                for ident in (f"sbx_{c}_action_t", f"sbx_{c}_action_name", f"SBX_{cu}_DO__COUNT",
                              f"SBX_{cu}_MAX_ACTIONS"):
                    claim(ident, origin)
                for a in m["actions"]:
                    claim(f"SBX_{cu}_DO_{cconst(a['name'])}", origin)
    for root in s.machines.values():
        if root["within"] is not None:
            continue
        family = [x for x in s.machines.values() if x["root"] is root]
        rows = [r for x in family for r in x["rows"]]
        used = {r["on"] for r in rows} | {r["then"] for r in rows if r["then"]}
        for e in root["events"]:
            if e["name"] not in used:
                raise SchemaError(f"{root['where']}: event '{e['name']}' is in no transition")
        done = {a for r in rows for a in r["do"]}
        for a in root["actions"]:
            if a["name"] not in done:
                raise SchemaError(f"{root['where']}: action '{a['name']}' is in no transition")
        root["family"] = family
        root["max_actions"] = max([len(r["do"]) for r in rows] + [1])


def _proto(head, params, end=";"):
    #  A prototype as clang-format lays it out: one line, else the parameters aligned.
    line = f"{head} ({', '.join(params)}){end}"
    if len(line) <= 100:
        return [line]
    pad = " " * (len(head) + 2)
    return [f"{head} ({params[0]},"] + [f"{pad}{p}," for p in params[1:-1]] + [f"{pad}{params[-1]}){end}"]


def _constants(rows):
    #  Enum constants with their docs above them (they are too long to trail).
    o = []
    for const, doc in rows:
        o.extend(comment(doc, "    "))
        o.append(f"    {const},")
    return o


def _machine_consts(m):
    root = m["root"]
    cu = cconst(root["cname"])

    def event(name):
        return f"SBX_{cu}_EV_{cconst(name)}" if name else f"SBX_{cu}_EV__NONE"

    def action(name):
        return f"SBX_{cu}_DO_{cconst(name)}"
    return event, action


def gen_lifecycle_header(s):
    o = []
    w = o.append
    w(f"//  GENERATED by {GENERATOR} from the schemas/ files - do not edit: change the schemas")
    w(f"//  and run `python3 {GENERATOR}`. The state machines of schemas/lifecycle.json as")
    w("//  tables (docs/lifecycle.md): in state `from`, `event` leads `to`, with what the row")
    w("//  asks or does. A (state, event) without a row is refused: _transition returns NULL.")
    w("#ifndef SBX_LIFECYCLE_GEN_H_INCLUDED")
    w("#define SBX_LIFECYCLE_GEN_H_INCLUDED")
    w("")
    w('#include "sbx_msg.h"')
    w("")
    w("#include <stddef.h>")
    w("")
    w("#ifdef __cplusplus")
    w('extern "C" {')
    w("#endif")
    w("")
    w("//  What an event is: a request is refused (failed_precondition) where no row takes it;")
    w("//  a failure's code and message are the outcome; anything else is ignored there.")
    w("typedef enum {")
    o.extend(aligned([(f"SBX_LIFECYCLE_{cconst(k)},", doc) for k, doc in zip(EVENT_KINDS, (
        "something happened", "asked from outside", "something failed", "a timer's beat"))]))
    w("} sbx_lifecycle_kind_t;")
    for m in s.machines.values():
        c, cu = m["cname"], cconst(m["cname"])
        root = m["root"]
        rc = cconst(root["cname"])
        w("")
        head = f"Machine {m['name']}" + (f" (within {root['name']})" if root is not m else "")
        o.extend(comment(f"{head}, {m['file']}: {m['doc']}"))
        if root is m:
            w("typedef enum {")
            w(f"    SBX_{cu}_EV__NONE = -1,")
            o.extend(_constants([(f"SBX_{cu}_EV_{cconst(e['name'])}",
                                  f"({e['kind']}) {e['doc']}" if e["kind"] != "notice" else e["doc"])
                                 for e in m["events"]]))
            w(f"    SBX_{cu}_EV__COUNT")
            w(f"}} sbx_{c}_event_t;")
            w(f"//  The event's name in the schema, or NULL; its kind (notice when out of range).")
            w(f"const char *sbx_{c}_event_name (sbx_{c}_event_t event);")
            w(f"sbx_lifecycle_kind_t sbx_{c}_event_kind (sbx_{c}_event_t event);")
            if m["actions"]:
                w("")
                w("typedef enum {")
                o.extend(_constants([(f"SBX_{cu}_DO_{cconst(a['name'])}", a["doc"])
                                     for a in m["actions"]]))
                w(f"    SBX_{cu}_DO__COUNT")
                w(f"}} sbx_{c}_action_t;")
                w(f"#define SBX_{cu}_MAX_ACTIONS {m['max_actions']}")
                w(f"const char *sbx_{c}_action_name (sbx_{c}_action_t action);")
        if m["enum"] is None:
            w("")
            w(f"//  {m['name']}'s states; the first is where it starts.")
            w("typedef enum {")
            o.extend(_constants([(m["state_const"](st["name"]), st["doc"]) for st in m["states"]]))
            w(f"    SBX_{cu}__COUNT")
            w(f"}} {m['state_type']};")
            w(f"const char *sbx_{c}_state_name ({m['state_type']} state);")
        w("")
        w("typedef struct {")
        w(f"    {m['state_type']} from;")
        w(f"    sbx_{root['cname']}_event_t event;")
        w(f"    {m['state_type']} to;")
        if m["has_ask"]:
            w("    sbx_msg_type_t ask; //  the request this sends, SBX_MSG__UNKNOWN: none")
        if m["has_actions"]:
            w(f"    //  Fired after the actions; SBX_{rc}_EV__NONE: none.")
            w(f"    sbx_{root['cname']}_event_t then;")
            w("    size_t action_count;")
            w(f"    sbx_{root['cname']}_action_t actions[SBX_{rc}_MAX_ACTIONS]; //  in order")
        w(f"}} sbx_{c}_transition_t;")
        w(f"#define SBX_{cu}_TRANSITIONS {len(m['rows'])}")
        w(f"extern const sbx_{c}_transition_t sbx_{c}_transitions[SBX_{cu}_TRANSITIONS];")
        o.extend(_proto(f"const sbx_{c}_transition_t *sbx_{c}_transition",
                        [f"{m['state_type']} from", f"sbx_{root['cname']}_event_t event"]))
    w("")
    w("#ifdef __cplusplus")
    w("}")
    w("#endif")
    w("")
    w("#endif")
    return "\n".join(o) + "\n"


def gen_lifecycle_source(s):
    o = []
    w = o.append
    w(f"//  GENERATED by {GENERATOR} from the schemas/ files - do not edit: change the schemas")
    w(f"//  and run `python3 {GENERATOR}`. The tables of sbx_lifecycle_gen.h.")
    w('#include "sbx_lifecycle_gen.h"')
    for m in s.machines.values():
        c, cu = m["cname"], cconst(m["cname"])
        root = m["root"]
        event, action = _machine_consts(m)
        w("")
        w(f"//  Machine {m['name']}.")
        if root is m:
            w(f"static const char *const s_{c}_event_names[SBX_{cu}_EV__COUNT] = {{")
            for e in m["events"]:
                w(f'    "{e["name"]}",')
            w("};")
            w(f"static const sbx_lifecycle_kind_t s_{c}_event_kinds[SBX_{cu}_EV__COUNT] = {{")
            for e in m["events"]:
                w(f"    SBX_LIFECYCLE_{cconst(e['kind'])},")
            w("};")
            w("")
            w(f"const char *sbx_{c}_event_name (sbx_{c}_event_t event)")
            w("{")
            w(f"    return event >= 0 && event < SBX_{cu}_EV__COUNT ? s_{c}_event_names[event] : NULL;")
            w("}")
            w("")
            w(f"sbx_lifecycle_kind_t sbx_{c}_event_kind (sbx_{c}_event_t event)")
            w("{")
            w(f"    if (event < 0 || event >= SBX_{cu}_EV__COUNT)")
            w("        return SBX_LIFECYCLE_NOTICE;")
            w(f"    return s_{c}_event_kinds[event];")
            w("}")
            if m["actions"]:
                w("")
                w(f"static const char *const s_{c}_action_names[SBX_{cu}_DO__COUNT] = {{")
                for a in m["actions"]:
                    w(f'    "{a["name"]}",')
                w("};")
                w("")
                w(f"const char *sbx_{c}_action_name (sbx_{c}_action_t action)")
                w("{")
                w(f"    if ((int) action < 0 || action >= SBX_{cu}_DO__COUNT)")
                w("        return NULL;")
                w(f"    return s_{c}_action_names[action];")
                w("}")
        if m["enum"] is None:
            w("")
            w(f"static const char *const s_{c}_state_names[SBX_{cu}__COUNT] = {{")
            for st in m["states"]:
                w(f'    "{st["name"]}",')
            w("};")
            w("")
            w(f"const char *sbx_{c}_state_name ({m['state_type']} state)")
            w("{")
            w(f"    if ((int) state < 0 || state >= SBX_{cu}__COUNT)")
            w("        return NULL;")
            w(f"    return s_{c}_state_names[state];")
            w("}")
        w("")
        w("// clang-format off")
        w(f"const sbx_{c}_transition_t sbx_{c}_transitions[SBX_{cu}_TRANSITIONS] = {{")
        for r in m["rows"]:
            cols = [m["state_const"](r["from"]), event(r["on"]), m["state_const"](r["to"])]
            if m["has_ask"]:
                cols.append(f"SBX_MSG_{cconst(r['ask'])}" if r["ask"] else "SBX_MSG__UNKNOWN")
            if m["has_actions"]:
                cols.append(event(r["then"]))
                cols.append(str(len(r["do"])))
                cols.append("{" + (", ".join(action(a) for a in r["do"]) or "0") + "}")
            w("    {" + ", ".join(cols) + "},")
        w("};")
        w("// clang-format on")
        w("")
        o.extend(_proto(f"const sbx_{c}_transition_t *sbx_{c}_transition",
                        [f"{m['state_type']} from", f"sbx_{root['cname']}_event_t event"], ""))
        w("{")
        w(f"    for (size_t i = 0; i < SBX_{cu}_TRANSITIONS; i++)")
        w(f"        if (sbx_{c}_transitions[i].from == from && sbx_{c}_transitions[i].event == event)")
        w(f"            return &sbx_{c}_transitions[i];")
        w("    return NULL;")
        w("}")
    return "\n".join(o) + "\n"


def gen_lifecycle_markdown(s):
    o = []
    w = o.append
    w(f"<!-- GENERATED by {GENERATOR} from schemas/lifecycle.json - do not edit. -->")
    w("# sbx lifecycles: the state tables")
    w("")
    w(md(s.files[[f for f, _ in s.files].index("lifecycle.json")][1])
      if "lifecycle.json" in [f for f, _ in s.files] else "The state machines of the schemas.")
    w("")
    w("Read a table row as: in state *in*, event *on* leads to *goes to* (blank: it stays), "
      "after which the process asks another for a message, performs the actions in order "
      "and fires the event under *then*. An event that no row takes in a state is refused: "
      "a request is answered `failed_precondition` (\"cannot stop sandbox sb_…: it is stopped\"), "
      "anything else is ignored. In a sub-machine's table the events and actions are its "
      "parent's. C: `common/sbx_lifecycle_gen.h`, generated with these tables by "
      f"`{GENERATOR}` (and checked by `{GENERATOR} --check`).")
    w("")
    w("## Contents")
    w("")
    for m in s.machines.values():
        sub = f" (within {m['root']['name']})" if m["root"] is not m else ""
        w(f"- [{m['name']}](#machine-{m['name']}){sub}")
    for m in s.machines.values():
        root = m["root"]
        w("")
        w(f"<a id=\"machine-{m['name']}\"></a>")
        w(f"## {m['name']}" + (f" (within [{root['name']}](#machine-{root['name']}))"
                                if root is not m else ""))
        w("")
        w(md(m["doc"]))
        w("")
        w("| state | meaning |")
        w("|---|---|")
        for i, st in enumerate(m["states"]):
            note = md(st["doc"]) if st["doc"] else ""
            if m["enum"] is None and i == 0:
                note = f"(where it starts) {note}"
            w(f"| `{st['name']}` | {note} |")
        w("")
        if root is m:
            w("| event | kind | meaning |")
            w("|---|---|---|")
            for e in m["events"]:
                w(f"| `{e['name']}` | {e['kind']} | {md(e['doc'])} |")
            w("")
            if m["actions"]:
                w("| action | what it does |")
                w("|---|---|")
                for a in m["actions"]:
                    w(f"| `{a['name']}` | {md(a['doc'])} |")
                w("")
        cols = ["in", "on", "goes to"]
        if m["has_ask"]:
            cols.append("asks")
        if m["has_actions"]:
            cols += ["does", "then"]
        cols.append("note")
        w("| " + " | ".join(cols) + " |")
        w("|" + "---|" * len(cols))
        for g in m["groups"]:
            cells = [", ".join(g["from"]), ", ".join(f"`{e}`" for e in g["on"]),
                     g["to"] or ""]
            if m["has_ask"]:
                cells.append(f"`{g['ask']}`" if g["ask"] else "")
            if m["has_actions"]:
                cells += [", ".join(g["do"]), f"`{g['then']}`" if g["then"] else ""]
            cells.append(md(g["doc"]) if g["doc"] else "")
            w("| " + " | ".join(cells) + " |")
        w("")
        events = [e["name"] for e in root["events"] if any(r["on"] == e["name"] for r in m["rows"])]
        rows = {(r["from"], r["on"]): r for r in m["rows"]}
        w(f"State × event (`=`: stays; `·`: {'passed on to ' + root['name'] if root is not m else 'refused'}):")
        w("")
        w("| | " + " | ".join(f"`{e}`" for e in events) + " |")
        w("|---|" + "---|" * len(events))
        for st in m["states"]:
            cells = []
            for e in events:
                r = rows.get((st["name"], e))
                cells.append("·" if r is None else "=" if r["to"] == r["from"] else r["to"])
            w(f"| **{st['name']}** | " + " | ".join(cells) + " |")
    return "\n".join(o) + "\n"


def gen_python_codes(s):
    """The error catalogue for the Python SDK (sbx.errors makes a class of each)."""
    lines = [f"# GENERATED by {GENERATOR} from schemas/errors.json - do not edit.",
             "# The service's error codes: code -> (HTTP status, what it means).", "CODES = {"]
    for e in s.errors:
        lines.append(f"    {e['code']!r}: ({e['http']}, {e['doc']!r}),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _ts_type(schema):
    """A TypeScript type for a JSON Schema of docs/openapi.json's components."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kinds = schema.get("type", "object")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    out = []
    for kind in kinds:
        if kind in ("integer", "number"):
            out.append("number")
        elif kind in ("string", "boolean", "null"):
            out.append(kind)
        elif kind == "array":
            item = _ts_type(schema.get("items", {}))
            out.append(f"Array<{item}>")
        elif "properties" in schema:
            required = set(schema.get("required", []))
            fields = [f"{name}{'' if name in required else '?'}: {_ts_type(sub)}"
                      for name, sub in schema["properties"].items()]
            out.append("{ " + "; ".join(fields) + " }")
        elif isinstance(schema.get("additionalProperties"), dict):
            out.append(f"Record<string, {_ts_type(schema['additionalProperties'])}>")
        else:
            out.append("Record<string, unknown>")
    return " | ".join(out)


def gen_ts_types(openapi_text, s):
    """The TypeScript SDK's types: docs/openapi.json's schemas, and the error codes."""
    doc = json.loads(openapi_text)
    lines = [f"// GENERATED by {GENERATOR} from docs/openapi.json and schemas/errors.json -",
             "// do not edit. The REST API's shapes, as its answers have them.", ""]
    for name, schema in doc["components"]["schemas"].items():
        if schema.get("description"):
            lines.append(f"/** {schema['description']} */")
        if schema.get("type") == "object" and "properties" in schema:
            required = set(schema.get("required", []))
            lines.append(f"export interface {name} {{")
            for field, sub in schema["properties"].items():
                if sub.get("description"):
                    lines.append(f"  /** {sub['description']} */")
                lines.append(f"  {field}{'' if field in required else '?'}: {_ts_type(sub)};")
            lines.append("}")
        else:
            lines.append(f"export type {name} = {_ts_type(schema)};")
        lines.append("")
    lines.append("/** The service's error codes, with their HTTP status. */")
    lines.append("export const ERROR_CODES = {")
    for e in s.errors:
        lines.append(f"  {e['code']}: {e['http']},")
    lines.append("} as const;")
    lines.append("export type ErrorCode = keyof typeof ERROR_CODES;")
    return "\n".join(lines) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare the outputs with the files on disk; exit 1 on any difference")
    ap.add_argument("--drift", action="store_true",
                    help="list the differences between MCP and REST that operations.json records")
    ap.add_argument("--root", default=os.path.dirname(here), help="repository root")
    args = ap.parse_args()
    try:
        s = load(os.path.join(args.root, "schemas"))
        o = load_operations(s, os.path.join(args.root, "schemas", OPERATIONS))
        if args.drift:
            print("\n".join(drift(o)))
            return 0
        outputs = dict(zip(OUTPUTS, (gen_header(s), gen_source(s), gen_markdown(s), gen_openapi(o),
                                     gen_ops_header(o), gen_ops_source(o))))
        outputs.update(zip(LIFECYCLE_OUTPUTS, (gen_lifecycle_header(s), gen_lifecycle_source(s),
                                               gen_lifecycle_markdown(s))))
        outputs.update(zip(SDK_OUTPUTS, (gen_python_codes(s),
                                         gen_ts_types(outputs["docs/openapi.json"], s))))
    except SchemaError as e:
        print(f"gen.py: schema error: {e}", file=sys.stderr)
        return 2
    stale = []
    for rel, text in outputs.items():
        path = os.path.join(args.root, rel)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                current = f.read()
        except OSError:
            current = None
        if current == text:
            continue
        if args.check:
            stale.append(rel)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        print(f"gen.py: wrote {rel}")
    if stale:
        for rel in stale:
            print(f"gen.py: {rel} differs from what schemas/*.json generate; "
                  f"run python3 {GENERATOR}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
