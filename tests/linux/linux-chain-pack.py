# SPDX-License-Identifier: LGPL-2.1-or-later
"""Diff-snapshot chains of the Linux guest (part of test-linux-guest.py): links, /info,
DELETE with dependents, compact, pack and unpack, a tampered archive, push to a registry and pull
back, a parent made again."""
import json
import os
import shutil
import tempfile
import time

from linuxguest import TAG, rest, rest_raw
from ociregistry import Registry


def push_pull(t, stack, state, links, head_sees, tags):
    """The chain pushed to a docker-registry on loopback, deleted here, pulled back: the
    pulled head's child sees every link's file and global."""
    tmp = tempfile.mkdtemp(prefix="forkd-linux-push.")
    os.mkdir(os.path.join(tmp, "registry"))
    reg = Registry(os.path.join(tmp, "registry"))
    try:
        ref = f"{reg.host}/forkd/chain:1"
        with open(os.path.join(state, "registries.json"), "w") as f:  # forkd reads it at each use
            json.dump({"registries": [{"host": reg.host, "insecure_http": True}]}, f)
        status, r = rest(stack, "POST", "/v1/snapshots/lx-c3/push", {"ref": ref})
        if not t.ok(status == 200 and (r or {}).get("links") == 4, "push the depth-3 chain: 200, 4 links", f"{status} {r}"):
            return
        status, _ = rest(stack, "DELETE", f"/v1/snapshots/{TAG}?cascade=true")
        left = tags()
        t.ok(status == 204 and left is not None and not ({TAG, *links} & left), "the pushed chain deleted here",
             f"{status} {left}")
        status, r = rest(stack, "POST", "/v1/snapshots/pull", {"ref": ref})
        pulled = [x.get("tag") for x in r] if status == 201 and isinstance(r, list) else r
        t.ok(pulled == [TAG] + links, "pull: 201 with the chain, root first", f"{status} {pulled}")
        seen = head_sees("lx-c3")
        t.ok(seen == "1 2 3 123\n", "a child of the pulled head sees every link's file and global", seen)
    finally:
        reg.stop()
        os.unlink(os.path.join(state, "registries.json"))
        shutil.rmtree(tmp, ignore_errors=True)


def chains(t, fc, stack, state):
    """REST API v1's diff-snapshot chains on the Linux guest: a base and three
    diff links, each step writing a file and setting a Python global; the head's
    children see all three; /info at every depth; DELETE with dependents (409, both
    flags 400, force, cascade); compact; pack, delete, unpack and fork; a tampered
    archive; a re-snapshotted parent."""
    links = ["lx-c1", "lx-c2", "lx-c3"]
    clock = [time.monotonic()]

    def lap(what):
        """A TAP comment with the wall time since the last one (TCG figures, not the product's speed)."""
        now = time.monotonic()
        t.note(f"{what}: {now - clock[0]:.1f} s under TCG")
        clock[0] = now

    show = ("import os\nprint(a, b, c, ''.join(open(f'/root/l{i}').read() for i in (1, 2, 3)))")

    fork_errors = []

    def fork_one(tag):
        status, sbs = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": 1})
        if status == 201 and isinstance(sbs, list) and len(sbs) == 1:
            return sbs[0]["id"]
        fork_errors.append(f"fork of {tag}: {status} {sbs}")  # said in the failing check's details
        return None

    def run_in(sid, code):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": code})
        return r if status == 200 and isinstance(r, dict) else {"status": status, "body": r}

    def head_sees(tag):
        sid = fork_one(tag)
        out = run_in(sid, show).get("stdout") if sid else "no child"
        if sid:
            rest(stack, "DELETE", f"/v1/sandboxes/{sid}")
        return out

    def tags():
        status, snaps = rest(stack, "GET", "/v1/snapshots")
        return {s.get("tag") for s in snaps} if status == 200 and isinstance(snaps, list) else None

    # 1. a base and three links, each step a file and a global
    parent, made = TAG, True
    for i, (tag, var) in enumerate(zip(links, "abc"), 1):
        sid = fork_one(parent)
        r = run_in(sid, f"{var} = {i}\nopen('/root/l{i}', 'w').write('{i}')") if sid else {}
        status, info = rest(stack, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": tag, "mode": "diff"})
        ok = (r.get("exit_code") == 0 and status == 201 and isinstance(info, dict)
              and info.get("parent_tag") == parent)
        made &= t.ok(ok, f"link {i}: a step ({var} = {i}, /root/l{i}) and a diff branch {tag} of {parent}",
                     f"{r} {status} {info} {fork_errors[-1:] if not sid else ''}")
        if sid:
            rest(stack, "DELETE", f"/v1/sandboxes/{sid}")
        parent = tag
    lap("three links made (fork, a step, a diff branch each)")
    if not made:
        return
    # 2. the head's child sees all three steps
    seen = head_sees("lx-c3")
    t.ok(seen == "1 2 3 123\n", "a child of the chain's head sees all three steps", seen)
    # 3. /info at every depth
    infos = {tag: rest(stack, "GET", f"/v1/snapshots/{tag}/info")[1] for tag in [TAG] + links}
    want = {TAG: (0, [], ["lx-c1"], None), "lx-c1": (1, [TAG], ["lx-c2"], TAG),
            "lx-c2": (2, [TAG, "lx-c1"], ["lx-c3"], "lx-c1"), "lx-c3": (3, [TAG, "lx-c1", "lx-c2"], [], "lx-c2")}
    good = True
    for tag, (depth, anc, deps, ptag) in want.items():
        i = infos.get(tag) if isinstance(infos.get(tag), dict) else {}
        good &= (i.get("chain_depth") == depth and i.get("ancestors") == anc and set(deps) <= set(i.get("dependents", []))
                 and i.get("parent_tag") == ptag and i.get("vmstate_bytes", 0) > 0
                 and (ptag is None or (len(i.get("parent_content_hash") or "") == 64
                                       and i.get("memory_physical_bytes", 1 << 40) < i.get("memory_logical_bytes", 0))))
    t.ok(good, "/info at depths 0 to 3: chain_depth, ancestors root first, dependents, parent_tag and hash, "
         "a link's memory_physical_bytes below its logical size, vmstate_bytes", infos)
    # 4. DELETE of the base with dependents
    status, r = rest(stack, "DELETE", f"/v1/snapshots/{TAG}")
    t.ok(status == 409 and "lx-c1" in (r or {}).get("error", ""), "DELETE of the base: 409 naming its dependent",
         f"{status} {r}")
    status, r = rest(stack, "DELETE", f"/v1/snapshots/{TAG}?cascade=true&force=true")
    t.ok(status == 400, "DELETE with cascade and force: 400", f"{status} {r}")
    # 5. compact, then fork the flat snapshot
    status, r = rest(stack, "POST", "/v1/snapshots/lx-c3/compact", {"to": "lx-flat"})
    flat = rest(stack, "GET", "/v1/snapshots/lx-flat/info")[1]
    seen = head_sees("lx-flat") if status == 201 else None
    t.ok(status == 201 and isinstance(flat, dict) and flat.get("chain_depth") == 0
         and not flat.get("parent_tag") and seen == "1 2 3 123\n",
         "compact lx-c3 to lx-flat: 201, a flat snapshot whose child sees all three steps", f"{status} {r} {flat} {seen}")
    t.ok(all(rest(stack, "GET", f"/v1/snapshots/{x}/info")[0] == 200 for x in links), "the chain is left intact")
    lap("checks of the chain, compact and a child of the flat snapshot")
    # 6 and 7. pack, delete, a tampered archive refused, unpack, fork
    status, archive = rest_raw(stack, "GET", "/v1/snapshots/lx-c3/pack")
    t.ok(status == 200 and len(archive) > 1024, f"pack the chain: {len(archive)} bytes", status)
    lap("pack of the chain")
    status, r = rest(stack, "DELETE", f"/v1/snapshots/{TAG}?cascade=true")
    left = tags()
    t.ok(status == 204 and left is not None and not ({TAG, *links} & left),
         "DELETE the base with cascade: the base and its three links are gone", f"{status} {r} {left}")
    bad = bytearray(archive)
    bad[len(bad) // 2] ^= 0x01
    status, r = rest_raw(stack, "POST", "/v1/snapshots/unpack", bytes(bad))
    left = tags()
    t.ok(status == 400 and left is not None and not ({TAG, *links} & left),
         "unpack of the archive with one byte changed: 400, nothing registered", f"{status} {r[:300]} {left}")
    lap("unpack of the tampered archive")
    status, r = rest_raw(stack, "POST", "/v1/snapshots/unpack", archive)
    try:
        unpacked = [s.get("tag") for s in json.loads(r)]
    except (ValueError, AttributeError, TypeError):
        unpacked = r[:300]
    t.ok(status == 201 and unpacked == [TAG] + links, "unpack: 201 with the chain, root first", f"{status} {unpacked}")
    lap("unpack of the chain")
    seen = head_sees("lx-c3")
    t.ok(seen == "1 2 3 123\n", "a child of the unpacked head sees all three steps", seen)
    lap("a child of the unpacked head")
    push_pull(t, stack, state, links, head_sees, tags)
    lap("push and pull of the chain, a child of the pulled head")
    # force: an orphan fails to fork with a clear error
    status, r = rest(stack, "DELETE", "/v1/snapshots/lx-c2?force=true")
    status2, r2 = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": "lx-c3", "n": 1})
    t.ok(status == 204 and status2 >= 400 and "lx-c2" in str(r2), "DELETE lx-c2 with force orphans lx-c3, "
         "whose fork then fails naming the missing parent", f"{status} {r}; {status2} {r2}")
    # 8. a re-snapshotted parent
    sid = fork_one("lx-c1")
    run_in(sid, "b = 'other'\nopen('/root/l2', 'w').write('x')")
    status, info = rest(stack, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "lx-c2", "mode": "diff"})
    rest(stack, "DELETE", f"/v1/sandboxes/{sid}")
    status2, r2 = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": "lx-c3", "n": 1})
    err = (r2 or {}).get("error", "") if isinstance(r2, dict) else str(r2)
    t.ok(status == 201 and status2 == 409 and "references" in err and "but parent now has content" in err,
         "lx-c2 made again with other content: forking lx-c3 gives 409 with REST API v1's message",
         f"{status}; {status2} {err}")
    rc, r, err = fc("snapshot", "rm", "--cascade", TAG)
    t.ok(rc == 0 and tags() is not None and not ({TAG, *links} & tags()), "snapshot rm --cascade of the base", err)
    rest(stack, "DELETE", "/v1/snapshots/lx-flat")
    lap("an orphan, a parent made again, rm --cascade")
