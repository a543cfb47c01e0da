package aws

import "time"

// Instance states, with the codes EC2 gives them.
var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

type instance struct {
	ID            string
	ReservationID string
	ImageID       string
	Type          string
	Arch          string
	KeyName       string
	SubnetID      string
	VpcID         string
	AZ            string
	State         string
	LaunchTime    time.Time
	RunningAt     time.Time // pending -> running
	TerminateAt   time.Time // shutting-down -> terminated
	StopAt        time.Time // stopping -> stopped
	GoneAt        time.Time // terminated -> no longer listed
	PrivateIP     string
	PublicIP      string
	IPv6          string
	Groups        []string
	Tags          map[string]string
	ClientToken   string
	Spot          bool
	SpotRequestID string
	ReasonCode    string
	ReasonMessage string
	Transition    string
	EbsOptimized  bool
	IAMProfileArn string
	HTTPTokens    string
	HTTPEndpoint  string
	RootDevice    string
	RootVolumeID  string
	HostID        string
	Tenancy       string
	UserData      string
	FleetID       string
}

type spotRequest struct {
	ID          string
	InstanceID  string
	Type        string
	State       string // open, active, closed, cancelled, failed
	StatusCode  string
	StatusMsg   string
	StatusTime  time.Time
	Created     time.Time
	AZ          string
	Tags        map[string]string
	InterruptAt time.Time // set by an interruption notice
}

type volume struct {
	ID          string
	Size        int
	Type        string
	Iops        int
	Throughput  int
	AZ          string
	State       string // creating, available, in-use, deleting
	SnapshotID  string
	Created     time.Time
	Tags        map[string]string
	InstanceID  string
	Device      string
	DeleteOnEnd bool
	AttachTime  time.Time
	GoneAt      time.Time
}

type snapshot struct {
	ID          string
	VolumeID    string
	Size        int
	State       string // pending, completed, error
	Progress    int
	Started     time.Time
	CompleteAt  time.Time // zero: not yet known (EBS direct until CompleteSnapshot)
	Description string
	Tags        map[string]string
	Owner       string
	// EBS direct: blocks written, and whether CompleteSnapshot came.
	Direct    bool
	Blocks    map[int32]bool
	Completed bool
}

type blockDevice struct {
	DeviceName  string
	SnapshotID  string
	Size        int
	Type        string
	Iops        int
	Throughput  int
	DeleteOnEnd bool
	Encrypted   bool
	NoDevice    bool
}

type image struct {
	ID             string
	Name           string
	Description    string
	State          string // pending, available, failed, deregistered
	Arch           string
	EnaSupport     bool
	ImdsSupport    string
	BootMode       string
	RootDevice     string
	Virtualization string
	Devices        []blockDevice
	Tags           map[string]string
	Owner          string
	Public         bool
	Created        time.Time
	AvailableAt    time.Time
	ImageType      string
}

type importTask struct {
	ID          string
	Kind        string // snapshot or image
	Description string
	Format      string
	Bucket      string
	Key         string
	URL         string
	Size        int64
	Arch        string
	Platform    string
	BootMode    string
	State       string // active, completed, deleting, deleted
	StatusMsg   string
	Started     time.Time
	DoneAt      time.Time
	SnapshotID  string
	ImageID     string
	Tags        map[string]string
}

type fleet struct {
	Errors    items[xmlFleetError]
	ID        string
	Type      string
	Created   time.Time
	Instances []string
	Tags      map[string]string
}

type launchTemplate struct {
	ID      string
	Name    string
	Created time.Time
	Spec    launchSpec
	Tags    map[string]string
}

type host struct {
	ID           string
	InstanceType string
	AZ           string
	State        string // available, released
	Allocated    time.Time
	Released     time.Time
	Instances    []string
	Tags         map[string]string
	ClientToken  string
	AutoPlace    string
}

// launchSpec is what a launch asks for, from RunInstances or from a launch
// template with a fleet's overrides.
type launchSpec struct {
	ImageID      string
	InstanceType string
	KeyName      string
	SubnetID     string
	Groups       []string
	PublicIP     *bool
	IPv6Count    int
	UserData     string
	IAMArn       string
	IAMName      string
	HTTPTokens   string
	HTTPEndpoint string
	Devices      []blockDevice
	EbsOptimized bool
	Spot         bool
	SpotMaxPrice string
	AZ           string
	HostID       string
	Tenancy      string
	Tags         map[string]map[string]string // by resource type
	ClientToken  string
}
