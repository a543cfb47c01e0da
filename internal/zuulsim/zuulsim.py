#!/usr/bin/python3
# A stand-in for Zuul's scheduler and executors in ZooKeeper, for tests of
# the zookeeper role: it takes, with kazoo (Debian's python3-kazoo, so the
# locks are kazoo's own), the steps Zuul takes toward a Nodepool launcher
# (shared/reference/zuul-nodepool-protocol.md, section 2), and checks what
# it reads the way Zuul's parsers do: a key Zuul requires that is missing
# is an error here too.
#
# It reads one JSON command per line on stdin and answers one JSON line
# on stdout: {"ok": true, "result": ...} or {"ok": false, "error": "..."}.
# Commands run one at a time, in order; a test runs several of these
# processes for several executors.

import json
import sys
import threading
import time
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, LockTimeout, NoNodeError

REQUESTS = "/nodepool/requests"
REQUEST_LOCKS = "/nodepool/requests-lock"
NODES = "/nodepool/nodes"
POOLS = "/nodepool/components/pool"

# Keys Zuul's NodeRequest.fromDict and updateFromDict index directly.
REQUEST_REQUIRED = ["requestor_data", "requestor", "node_types", "provider",
                    "state", "state_time", "event_id"]
# Keys that must never be in a node: Zuul sets every key of a node's JSON
# as an attribute of its Node object.
NODE_FORBIDDEN = ["lock", "stat", "name", "label", "aliases"]


class Failure(Exception):
    pass


def say_state(state):
    sys.stderr.write("%s zookeeper session %s\n" % (time.strftime("%H:%M:%S"), state))
    sys.stderr.flush()


class Zuul:
    def __init__(self, hosts, ca, cert, key, timeout):
        self.zk = KazooClient(hosts=hosts, use_ssl=True, ca=ca,
                              certfile=cert, keyfile=key, timeout=timeout)
        # A session that is suspended or lost (its ephemeral locks gone)
        # is said on stderr, which the test prints when it fails.
        # (A listener that returns something true is removed: say_state
        # returns None.)
        self.zk.add_listener(say_state)
        self.zk.start(timeout=30)
        self.system_id = uuid.uuid4().hex
        self.node_locks = {}
        self.zk.ensure_path(REQUESTS)

    # -- reading, as Zuul's parsers read --------------------------------

    def request(self, rid):
        try:
            data, stat = self.zk.retry(self.zk.get, REQUESTS + "/" + rid)
        except NoNodeError:
            return None
        if not data:
            raise Failure("request %s has no data" % rid)
        d = json.loads(data.decode("utf8"))
        missing = [k for k in REQUEST_REQUIRED if k not in d]
        if missing:
            raise Failure("request %s lacks %s (Zuul's parser raises "
                          "KeyError): %s" % (rid, missing, d))
        d["_version"] = stat.version
        d["_id"] = rid
        return d

    def node(self, nid):
        try:
            data, stat = self.zk.retry(self.zk.get, NODES + "/" + nid)
        except NoNodeError:
            return None
        if not data:
            raise Failure("node %s has no data" % nid)
        d = json.loads(data.decode("utf8"))
        if "state" not in d:
            raise Failure("node %s has no state: %s" % (nid, d))
        bad = [k for k in NODE_FORBIDDEN if k in d]
        if bad or ("id" in d and d["id"] != nid):
            raise Failure("node %s carries keys Zuul would take for its "
                          "own: %s" % (nid, d))
        d["id"] = nid
        d["_version"] = stat.version
        return d

    def store_node(self, d):
        d = dict(d)
        d.pop("_version", None)
        self.zk.set(NODES + "/" + d["id"], json.dumps(d).encode("utf8"))

    # -- the scheduler ---------------------------------------------------

    def submit(self, labels, priority=200, relative_priority=0,
               provider=None, tenant="tenant-one", ephemeral=False,
               event_id=None, job="job"):
        now = time.time()
        data = {
            "requestor_data": {
                "build_set_uuid": uuid.uuid4().hex, "tenant_name": tenant,
                "pipeline_name": "check", "job_uuid": uuid.uuid4().hex,
                "job_name": job, "span_info": None},
            "node_types": labels, "requestor": self.system_id,
            "created_time": now, "provider": provider,
            "state": "requested", "state_time": now,
            "relative_priority": relative_priority,
            "event_id": event_id or uuid.uuid4().hex,
            "tenant_name": tenant,
        }
        path = self.zk.create("%s/%03d-" % (REQUESTS, priority),
                              json.dumps(data).encode("utf8"),
                              makepath=True, sequence=True,
                              ephemeral=ephemeral)
        return path.rsplit("/", 1)[1]

    def wait(self, id, states=("fulfilled", "failed"), timeout=60):
        deadline = time.time() + timeout
        changed = threading.Event()
        while True:
            changed.clear()
            # Reads are tried again through a lost connection (a
            # ZooKeeper server restarting), as kazoo's retry does.
            exists = self.zk.retry(self.zk.exists, REQUESTS + "/" + id,
                                   watch=lambda e: changed.set())
            r = self.request(id) if exists else None
            if r is None:
                raise Failure("request %s is gone" % id)
            if r["state"] in states:
                return r
            left = deadline - time.time()
            if left <= 0:
                raise Failure("request %s still %s after %ss: %s" %
                              (id, r["state"], timeout, r))
            changed.wait(min(left, 1.0))

    def revise(self, id, relative_priority):
        # Zuul's reviseRequest: a non-blocking lock (give up if a
        # launcher holds it), then a write at the version read.
        lock = self.zk.Lock(REQUEST_LOCKS + "/" + id)
        if not lock.acquire(blocking=False):
            return "locked"
        try:
            r = self.request(id)
            if r is None:
                return "gone"
            version = r.pop("_version")
            r.pop("_id")
            r["relative_priority"] = relative_priority
            try:
                self.zk.set(REQUESTS + "/" + id,
                            json.dumps(r).encode("utf8"), version=version)
            except BadVersionError:
                return "bad version"
            return "revised"
        finally:
            lock.release()

    def delete_request(self, id):
        try:
            self.zk.delete(REQUESTS + "/" + id)
            return True
        except NoNodeError:
            return False

    def registered_pools(self):
        out = []
        try:
            children = self.zk.retry(self.zk.get_children, POOLS)
        except NoNodeError:
            return out
        for c in children:
            try:
                data, _ = self.zk.get(POOLS + "/" + c)
            except NoNodeError:
                continue
            d = json.loads(data.decode("utf8"))
            d["supported_labels"] = sorted(set(d.get("supported_labels",
                                                     [])))
            out.append(d)
        return out

    def held_count(self, hold_job):
        n = 0
        for nid in self.zk.get_children(NODES):
            d = self.node(nid)
            if d and d["state"] == "hold" and d.get("hold_job") == hold_job:
                n += 1
        return n

    # -- the executor ----------------------------------------------------

    def lock_nodes(self, id, timeout=30):
        r = self.request(id)
        if r is None:
            raise Failure("request %s is gone" % id)
        if len(r.get("nodes", [])) != len(r["node_types"]):
            raise Failure("request %s: %d nodes for %d labels" %
                          (id, len(r.get("nodes", [])), len(r["node_types"])))
        locked = []
        try:
            for nid in r["nodes"]:
                d = self.node(nid)
                if d is None or d.get("allocated_to") != id:
                    raise Failure("node %s is not allocated to %s: %s" %
                                  (nid, id, d))
                lock = self.zk.Lock(NODES + "/" + nid + "/lock")
                if not lock.acquire(timeout=timeout):
                    raise Failure("did not get the lock of node %s" % nid)
                self.node_locks[nid] = lock
                locked.append(nid)
                d = self.node(nid)
                if d is None or d.get("allocated_to") != id:
                    raise Failure("node %s was reallocated while locking" %
                                  nid)
                check_inventory(d)
        except (Failure, LockTimeout) as e:
            for nid in locked:
                self.unlock([nid])
            raise Failure(str(e))
        return r["nodes"]

    def accept(self, id, timeout=30):
        # Zuul's acceptNodes: lock every node, then delete the request
        # whether or not locking worked.
        err = None
        nodes = []
        try:
            nodes = self.lock_nodes(id, timeout)
        except Failure as e:
            err = e
        self.delete_request(id)
        if err:
            raise err
        return nodes

    def use(self, nodes, project="review.example.org/org/project"):
        for nid in nodes:
            if nid not in self.node_locks:
                raise Failure("node %s is not locked" % nid)
            d = self.node(nid)
            d["state"] = "in-use"
            d["state_time"] = time.time()
            d["user_data"] = {"zuul_system": self.system_id,
                              "project_name": project}
            self.store_node(d)

    def return_nodes(self, nodes):
        for nid in nodes:
            d = self.node(nid)
            if d is not None and d["state"] == "in-use":
                d["state"] = "used"
                d["state_time"] = time.time()
                self.store_node(d)
        self.unlock(nodes)

    def hold(self, nodes, hold_job, comment, expiration=None):
        for nid in nodes:
            if nid not in self.node_locks:
                raise Failure("node %s is not locked" % nid)
            d = self.node(nid)
            d["state"] = "hold"
            d["state_time"] = time.time()
            d["hold_job"] = hold_job
            d["comment"] = comment
            if expiration:
                d["hold_expiration"] = expiration
            self.store_node(d)
        self.unlock(nodes)

    def release_hold(self, nodes):
        # Zuul's hold-request deletion: a non-blocking lock per node, then
        # used, then unlock.
        done = []
        for nid in nodes:
            d = self.node(nid)
            if d is None or d["state"] == "used":
                continue
            lock = self.zk.Lock(NODES + "/" + nid + "/lock")
            if not lock.acquire(blocking=False):
                raise Failure("node %s is locked" % nid)
            try:
                d = self.node(nid)
                d["state"] = "used"
                d["state_time"] = time.time()
                self.store_node(d)
                done.append(nid)
            finally:
                lock.release()
        return done

    def unlock(self, nodes):
        for nid in nodes:
            lock = self.node_locks.pop(nid, None)
            if lock:
                lock.release()

    def lock_request(self, id):
        lock = self.zk.Lock(REQUEST_LOCKS + "/" + id)
        if lock.acquire(blocking=False):
            self.node_locks["request:" + id] = lock
            return True
        return False

    def unlock_request(self, id):
        lock = self.node_locks.pop("request:" + id, None)
        if lock:
            lock.release()

    def lock_contenders(self, path):
        try:
            return sorted(self.zk.get_children(path))
        except NoNodeError:
            return []

    def stop(self):
        self.zk.stop()
        self.zk.close()

    # -- another launcher of the ensemble (a Python Nodepool's pool) -----

    def register_pool(self, id, provider, labels, priority=100,
                      paused=False):
        data = {"hostname": "python-launcher", "kind": "pool",
                "state": "running", "version": "10.0.0", "model_api": 0,
                "id": id, "name": "main", "provider_name": provider,
                "supported_labels": labels, "priority": priority,
                "paused": paused}
        path = self.zk.create(POOLS + "/python-launcher",
                              json.dumps(data, sort_keys=True).encode(),
                              makepath=True, ephemeral=True, sequence=True)
        return path

    def make_node(self, provider, label, state="ready", allocated_to=None):
        now = time.time()
        data = {"state": state, "state_time": now, "created_time": now,
                "provider": provider, "pool": "main", "cloud": provider,
                "region": None, "az": None, "type": [label],
                "allocated_to": allocated_to, "interface_ip": "192.0.2.1",
                "public_ipv4": "192.0.2.1", "private_ipv4": None,
                "public_ipv6": None, "host_id": None,
                "connection_port": 22, "ssh_port": 22,
                "connection_type": "ssh", "image_id": None,
                "launcher": "python-launcher", "external_id": "python-1",
                "hostname": "python-1", "comment": None, "user_data": None,
                "hold_job": None, "hold_expiration": None, "host_keys": [],
                "username": "zuul", "shell_type": None, "python_path": "auto",
                "resources": None, "slot": None, "attributes": None,
                "tenant_name": None, "driver_data": None, "requestor": None}
        path = self.zk.create(NODES + "/", json.dumps(data).encode(),
                              makepath=True, sequence=True)
        return path.rsplit("/", 1)[1]

    def decline(self, id, launcher_id):
        # A Nodepool pool's decline: under the request lock, its id in
        # declined_by; failed once every registered pool declined.
        lock = self.zk.Lock(REQUEST_LOCKS + "/" + id)
        if not lock.acquire(blocking=False):
            return "locked"
        try:
            r = self.request(id)
            version = r.pop("_version")
            r.pop("_id")
            if r["state"] != "requested":
                return r["state"]
            declined = r.setdefault("declined_by", [])
            if launcher_id not in declined:
                declined.append(launcher_id)
            ids = set(p["id"] for p in self.registered_pools())
            r["state"] = "failed" if ids <= set(declined) else "requested"
            r["state_time"] = time.time()
            self.zk.set(REQUESTS + "/" + id, json.dumps(r).encode("utf8"),
                        version=version)
            return r["state"]
        finally:
            lock.release()

    def raw_set(self, path, data):
        # Writes anything: a hostile or broken client's record.
        if self.zk.exists(path):
            self.zk.set(path, data.encode("utf8"))
        else:
            self.zk.create(path, data.encode("utf8"), makepath=True)
        return path

    def raw_create(self, path, data, sequence=False):
        return self.zk.create(path, data.encode("utf8"), makepath=True,
                              sequence=sequence)


def check_inventory(d):
    # What Zuul's executor needs to build its inventory from a node.
    if not isinstance(d.get("host_keys", []), list):
        raise Failure("node %s: host_keys is not a list: %r" %
                      (d["id"], d.get("host_keys")))
    port = d.get("connection_port", 22)
    if not isinstance(port, (int, dict)) or isinstance(port, bool):
        raise Failure("node %s: connection_port %r" % (d["id"], port))
    if "python_path" in d and not isinstance(d["python_path"], str):
        raise Failure("node %s: python_path %r" % (d["id"], d["python_path"]))
    if d.get("interface_ip") is None:
        raise Failure("node %s: no interface_ip" % d["id"])
    for k in ("attributes", "resources"):
        if d.get(k) is not None and not isinstance(d[k], dict):
            raise Failure("node %s: %s is not a mapping" % (d["id"], k))
    for k, v in (d.get("resources") or {}).items():
        if not isinstance(v, (int, float)):
            raise Failure("node %s: resources[%s] is not a number" %
                          (d["id"], k))


def main():
    hosts, ca, cert, key, timeout = sys.argv[1:6]
    z = Zuul(hosts, ca, cert, key, float(timeout))
    out = sys.stdout
    out.write(json.dumps({"ok": True, "result": z.system_id}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "request":
                result = z.request(cmd["id"])
            elif op == "node":
                result = z.node(cmd["id"])
            elif op == "dump":
                result = {}
                children = z.zk.retry(z.zk.get_children, NODES) \
                    if z.zk.retry(z.zk.exists, NODES) else []
                for c in children:
                    try:
                        data, _ = z.zk.retry(z.zk.get, NODES + "/" + c)
                    except NoNodeError:
                        continue
                    result[c] = data.decode("utf8")
            else:
                result = getattr(z, op)(**cmd)
            reply = {"ok": True, "result": result}
        except Exception as e:  # every failure is the test's to report
            reply = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if op == "stop":
            return


if __name__ == "__main__":
    main()
