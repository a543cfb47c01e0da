package openstack

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"
)

// state is everything the cloud holds. Times move servers and volumes on
// lazily: advance brings every object to what it is at a moment, before a
// request reads or changes the state.
type state struct {
	projectID string
	userID    string
	domainID  string

	tokens map[string]*token

	servers  map[string]*server // deleted ones stay as tombstones for changes-since
	flavors  []Flavor
	keypairs map[string]*keypair
	images   map[string]*image

	networks map[string]*network
	subnets  map[string]*subnet
	ports    map[string]*port
	fips     map[string]*floatingIP
	secgroup map[string]*securityGroup

	volumes map[string]*volume

	rng *rand.Rand
}

type token struct {
	id       string
	methods  []string
	issued   time.Time
	expires  time.Time
	appCred  string
	auditIDs []string
}

type server struct {
	id, name     string
	status       string // BUILD, ACTIVE, SHUTOFF, ERROR, DELETED
	taskState    string // spawning, powering-off, powering-on, deleting or ""
	flavor       Flavor
	imageID      string // "" when booted from a volume
	keyName      string
	az           string
	userData     string
	configDrive  bool
	metadata     map[string]string
	secGroups    []string // names
	ports        []string // port ids, in network order
	volumes      []volumeAttachment
	created      time.Time
	updated      time.Time
	readyAt      time.Time
	launchedAt   time.Time
	goneAt       time.Time // while deleting: when it is gone
	powerAt      time.Time // while powering off or on: when it is done
	deletedAt    time.Time
	fault        string // the fault's message when it goes to ERROR
	consoleLines []string
}

type volumeAttachment struct {
	volumeID            string
	deleteOnTermination bool
	attachmentID        string
}

type keypair struct {
	name, publicKey, fingerprint, typ string
	created                           time.Time
}

type image struct {
	id, name         string
	status           string // queued, saving, active, killed, deleted
	visibility       string
	diskFormat       string
	containerFormat  string
	minDisk, minRAM  int
	protected        bool
	tags             []string
	props            map[string]string
	size             int64
	checksum         string
	hashValue        string
	created, updated time.Time
	owner            string
}

type network struct {
	id, name  string
	external  bool
	shared    bool
	subnets   []string
	created   time.Time
	updated   time.Time
	revisions int
}

type subnet struct {
	id, name, networkID string
	cidr                netip.Prefix
	gateway             netip.Addr
	next                uint32 // next host number to hand out
	created             time.Time
}

type port struct {
	id, name    string
	networkID   string
	subnetID    string
	ip          string
	mac         string
	deviceID    string
	deviceOwner string
	status      string // ACTIVE, DOWN, BUILD
	secGroups   []string
	// byNova: Nova made the port for a server and deletes it with it.
	byNova   bool
	created  time.Time
	updated  time.Time
	revision int
}

type floatingIP struct {
	id          string
	address     string
	networkID   string
	portID      string
	fixedIP     string
	description string
	created     time.Time
	updated     time.Time
	revision    int
}

type securityGroup struct {
	id, name, description string
	created               time.Time
}

type volume struct {
	id, name    string
	status      string // creating, available, in-use, deleting, error
	size        int
	az          string
	imageID     string
	metadata    map[string]string
	description string
	serverID    string
	attachID    string
	attachedAt  time.Time
	device      string
	readyAt     time.Time
	goneAt      time.Time
	created     time.Time
	updated     time.Time
}

func newState(o *Options) *state {
	now := time.Now().UTC()
	st := &state{
		projectID: idFrom("project", o.Project),
		userID:    idFrom("user", o.User),
		domainID:  "default",
		tokens:    map[string]*token{},
		servers:   map[string]*server{},
		flavors:   append([]Flavor(nil), o.Flavors...),
		keypairs:  map[string]*keypair{},
		images:    map[string]*image{},
		networks:  map[string]*network{},
		subnets:   map[string]*subnet{},
		ports:     map[string]*port{},
		fips:      map[string]*floatingIP{},
		secgroup:  map[string]*securityGroup{},
		volumes:   map[string]*volume{},
		rng:       rand.New(rand.NewPCG(uint64(now.UnixNano()), 0x51ed2701)),
	}
	for _, name := range o.Images {
		id := idFrom("image", name)
		st.images[id] = &image{id: id, name: name, status: "active", visibility: "public", diskFormat: "qcow2",
			containerFormat: "bare", props: map[string]string{}, size: 21430272, tags: []string{},
			checksum: randomHex(16), hashValue: randomHex(64), created: now, updated: now, owner: st.projectID}
	}
	st.addNetwork("private", false, "10.0.0.0/22", now)
	st.addNetwork("public", true, "172.24.4.0/24", now)
	sg := &securityGroup{id: idFrom("secgroup", "default"), name: "default", description: "Default security group", created: now}
	st.secgroup[sg.id] = sg
	return st
}

// idFrom derives a stable UUID-shaped id from a name, so that the objects
// a cloud starts with keep their ids across restarts and resets.
func idFrom(kind, name string) string {
	var h uint64 = 1469598103934665603
	for _, b := range []byte(kind + "/" + name) {
		h ^= uint64(b)
		h *= 1099511628211
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], h)
	binary.BigEndian.PutUint64(b[8:], h*0x9e3779b97f4a7c15)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (st *state) addNetwork(name string, external bool, cidr string, now time.Time) {
	n := &network{id: idFrom("network", name), name: name, external: external, created: now, updated: now, revisions: 1}
	p := netip.MustParsePrefix(cidr)
	sn := &subnet{id: idFrom("subnet", name), name: name + "-subnet", networkID: n.id, cidr: p,
		gateway: p.Addr().Next(), next: 2, created: now}
	n.subnets = []string{sn.id}
	st.networks[n.id] = n
	st.subnets[sn.id] = sn
}

// nextIP hands out the next address of a subnet.
func (sn *subnet) nextIP() string {
	base := sn.cidr.Addr().As4()
	n := binary.BigEndian.Uint32(base[:]) + sn.next
	size := uint32(1) << (32 - sn.cidr.Bits())
	sn.next++
	if sn.next >= size-1 {
		sn.next = 2
	}
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], n)
	return netip.AddrFrom4(out).String()
}

func (st *state) mac() string {
	return fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", st.rng.IntN(256), st.rng.IntN(256), st.rng.IntN(256))
}

// tombstoneTTL is how long deleted servers stay visible to changes-since.
const tombstoneTTL = 10 * time.Minute

// advance brings servers and volumes to what they are at now.
func (c *Cloud) advance(now time.Time) {
	st := c.st
	for id, s := range st.servers {
		switch {
		case s.status == "DELETED":
			if now.Sub(s.deletedAt) > tombstoneTTL {
				delete(st.servers, id)
			}
		case s.taskState == "deleting" && !now.Before(s.goneAt):
			c.removeServer(s, s.goneAt)
		case (s.taskState == "powering-off" || s.taskState == "powering-on") && !now.Before(s.powerAt):
			s.status = "SHUTOFF"
			if s.taskState == "powering-on" {
				s.status = "ACTIVE"
			}
			s.taskState, s.updated = "", s.powerAt
		case s.status == "BUILD" && !now.Before(s.readyAt):
			s.updated, s.taskState = s.readyAt, ""
			if s.fault != "" {
				s.status = "ERROR"
				s.consoleLines = append(s.consoleLines, "[   12.345678] Kernel panic - not syncing: VFS: Unable to mount root fs")
				continue
			}
			s.status, s.launchedAt = "ACTIVE", s.readyAt
			for _, pid := range s.ports {
				if p := st.ports[pid]; p != nil {
					p.status, p.updated = "ACTIVE", s.readyAt
				}
			}
			s.consoleLines = append(s.consoleLines,
				"[    2.104512] cloud-init[512]: Cloud-init v. 24.1 running 'modules:final'",
				fmt.Sprintf("%s login: ", s.name))
		}
	}
	for id, v := range st.volumes {
		switch {
		case v.status == "creating" && !now.Before(v.readyAt):
			v.status, v.updated = "available", v.readyAt
			if v.serverID != "" {
				v.status = "in-use"
			}
		case v.status == "deleting" && !now.Before(v.goneAt):
			delete(st.volumes, id)
		}
	}
}

// removeServer makes a deleted server gone: its ports are deleted (their
// floating IPs let go), its volumes detached or deleted.
func (c *Cloud) removeServer(s *server, at time.Time) {
	st := c.st
	s.status, s.taskState, s.deletedAt, s.updated = "DELETED", "", at, at
	for _, pid := range s.ports {
		if p := st.ports[pid]; p != nil && p.byNova {
			delete(st.ports, pid)
			for _, f := range st.fips {
				if f.portID == pid {
					f.portID, f.fixedIP, f.updated = "", "", at
					f.revision++
				}
			}
		} else if p != nil {
			p.deviceID, p.deviceOwner, p.status, p.updated = "", "", "DOWN", at
		}
	}
	for _, a := range s.volumes {
		v := st.volumes[a.volumeID]
		if v == nil {
			continue
		}
		v.serverID, v.attachID, v.device = "", "", ""
		if a.deleteOnTermination {
			v.status, v.goneAt = "deleting", at.Add(c.volumeTime)
		} else {
			v.status, v.updated = "available", at
		}
	}
}

// live reports whether a server counts (not yet deleted).
func (s *server) live() bool { return s.status != "DELETED" }

// usage is what live servers, volumes and floating IPs hold.
func (st *state) usage() (instances, cores, ram, volumes, gigabytes, fips int) {
	for _, s := range st.servers {
		if s.live() {
			instances++
			cores += s.flavor.VCPUs
			ram += s.flavor.RAM
		}
	}
	for _, v := range st.volumes {
		volumes++
		gigabytes += v.size
	}
	return instances, cores, ram, volumes, gigabytes, len(st.fips)
}
