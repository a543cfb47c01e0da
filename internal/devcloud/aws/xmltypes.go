package aws

// The XML shapes of EC2's responses, with EC2's element names.

type xmlReservation struct {
	ReservationID string             `xml:"reservationId"`
	OwnerID       string             `xml:"ownerId"`
	Groups        items[xmlGroup]    `xml:"groupSet"`
	Instances     items[xmlInstance] `xml:"instancesSet"`
}

type xmlGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName"`
}

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xmlPlacement struct {
	AvailabilityZone string `xml:"availabilityZone"`
	GroupName        string `xml:"groupName"`
	Tenancy          string `xml:"tenancy"`
	HostID           string `xml:"hostId,omitempty"`
}

type xmlMonitoring struct {
	State string `xml:"state"`
}

type xmlInstanceEbs struct {
	VolumeID            string `xml:"volumeId"`
	Status              string `xml:"status"`
	AttachTime          ts     `xml:"attachTime"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
}

type xmlInstanceBlockDevice struct {
	DeviceName string         `xml:"deviceName"`
	Ebs        xmlInstanceEbs `xml:"ebs"`
}

type xmlMetadataOptions struct {
	State        string `xml:"state"`
	HTTPTokens   string `xml:"httpTokens"`
	HopLimit     int    `xml:"httpPutResponseHopLimit"`
	HTTPEndpoint string `xml:"httpEndpoint"`
	ProtocolIPv6 string `xml:"httpProtocolIpv6"`
	MetadataTags string `xml:"instanceMetadataTags"`
}

type xmlCPU struct {
	CoreCount      int `xml:"coreCount"`
	ThreadsPerCore int `xml:"threadsPerCore"`
}

type xmlIPv6 struct {
	Address string `xml:"ipv6Address"`
	Primary bool   `xml:"isPrimaryIpv6"`
}

type xmlAssociation struct {
	PublicIP  string `xml:"publicIp"`
	PublicDNS string `xml:"publicDnsName"`
	IPOwnerID string `xml:"ipOwnerId"`
}

type xmlNetworkInterface struct {
	ID              string          `xml:"networkInterfaceId"`
	SubnetID        string          `xml:"subnetId"`
	VpcID           string          `xml:"vpcId"`
	Description     string          `xml:"description"`
	OwnerID         string          `xml:"ownerId"`
	Status          string          `xml:"status"`
	PrivateIP       string          `xml:"privateIpAddress"`
	SourceDestCheck bool            `xml:"sourceDestCheck"`
	Groups          items[xmlGroup] `xml:"groupSet"`
	Association     *xmlAssociation `xml:"association,omitempty"`
	IPv6            items[xmlIPv6]  `xml:"ipv6AddressesSet"`
	InterfaceType   string          `xml:"interfaceType"`
}

type xmlStateReason struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xmlIAMProfile struct {
	Arn string `xml:"arn"`
	ID  string `xml:"id"`
}

type xmlInstance struct {
	InstanceID         string                        `xml:"instanceId"`
	ImageID            string                        `xml:"imageId"`
	State              xmlState                      `xml:"instanceState"`
	PrivateDNS         string                        `xml:"privateDnsName"`
	DNSName            string                        `xml:"dnsName"`
	Reason             string                        `xml:"reason"`
	KeyName            string                        `xml:"keyName,omitempty"`
	AmiLaunchIndex     int                           `xml:"amiLaunchIndex"`
	ProductCodes       items[struct{}]               `xml:"productCodes"`
	InstanceType       string                        `xml:"instanceType"`
	LaunchTime         ts                            `xml:"launchTime"`
	Placement          xmlPlacement                  `xml:"placement"`
	Monitoring         xmlMonitoring                 `xml:"monitoring"`
	SubnetID           string                        `xml:"subnetId,omitempty"`
	VpcID              string                        `xml:"vpcId,omitempty"`
	PrivateIP          string                        `xml:"privateIpAddress,omitempty"`
	PublicIP           string                        `xml:"ipAddress,omitempty"`
	IPv6               string                        `xml:"ipv6Address,omitempty"`
	SourceDestCheck    bool                          `xml:"sourceDestCheck"`
	Groups             items[xmlGroup]               `xml:"groupSet"`
	StateReason        *xmlStateReason               `xml:"stateReason,omitempty"`
	Architecture       string                        `xml:"architecture"`
	RootDeviceType     string                        `xml:"rootDeviceType"`
	RootDeviceName     string                        `xml:"rootDeviceName"`
	BlockDevices       items[xmlInstanceBlockDevice] `xml:"blockDeviceMapping"`
	Lifecycle          string                        `xml:"instanceLifecycle,omitempty"`
	SpotRequestID      string                        `xml:"spotInstanceRequestId,omitempty"`
	VirtualizationType string                        `xml:"virtualizationType"`
	ClientToken        string                        `xml:"clientToken"`
	Tags               items[xmlTag]                 `xml:"tagSet"`
	Hypervisor         string                        `xml:"hypervisor"`
	Interfaces         items[xmlNetworkInterface]    `xml:"networkInterfaceSet"`
	IAMProfile         *xmlIAMProfile                `xml:"iamInstanceProfile,omitempty"`
	EbsOptimized       bool                          `xml:"ebsOptimized"`
	EnaSupport         bool                          `xml:"enaSupport"`
	CPU                xmlCPU                        `xml:"cpuOptions"`
	Metadata           xmlMetadataOptions            `xml:"metadataOptions"`
}

type xmlStateChange struct {
	InstanceID string   `xml:"instanceId"`
	Current    xmlState `xml:"currentState"`
	Previous   xmlState `xml:"previousState"`
}

type xmlSpotStatus struct {
	Code       string `xml:"code"`
	UpdateTime ts     `xml:"updateTime"`
	Message    string `xml:"message"`
}

type xmlSpotRequest struct {
	ID           string        `xml:"spotInstanceRequestId"`
	Type         string        `xml:"type"`
	State        string        `xml:"state"`
	Status       xmlSpotStatus `xml:"status"`
	InstanceID   string        `xml:"instanceId,omitempty"`
	Created      ts            `xml:"createTime"`
	Product      string        `xml:"productDescription"`
	AZ           string        `xml:"launchedAvailabilityZone"`
	Tags         items[xmlTag] `xml:"tagSet"`
	Interruption string        `xml:"instanceInterruptionBehavior"`
}

type xmlEbs struct {
	SnapshotID          string `xml:"snapshotId,omitempty"`
	VolumeSize          int    `xml:"volumeSize"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
	VolumeType          string `xml:"volumeType"`
	Iops                int    `xml:"iops,omitempty"`
	Throughput          int    `xml:"throughput,omitempty"`
	Encrypted           bool   `xml:"encrypted"`
}

type xmlBlockDevice struct {
	DeviceName string  `xml:"deviceName"`
	Ebs        *xmlEbs `xml:"ebs,omitempty"`
	NoDevice   *string `xml:"noDevice,omitempty"`
}

type xmlImage struct {
	ImageID            string                `xml:"imageId"`
	ImageLocation      string                `xml:"imageLocation"`
	State              string                `xml:"imageState"`
	OwnerID            string                `xml:"imageOwnerId"`
	CreationDate       ts                    `xml:"creationDate"`
	IsPublic           bool                  `xml:"isPublic"`
	Architecture       string                `xml:"architecture"`
	ImageType          string                `xml:"imageType"`
	OwnerAlias         string                `xml:"imageOwnerAlias,omitempty"`
	Name               string                `xml:"name"`
	Description        string                `xml:"description,omitempty"`
	RootDeviceType     string                `xml:"rootDeviceType"`
	RootDeviceName     string                `xml:"rootDeviceName"`
	BlockDevices       items[xmlBlockDevice] `xml:"blockDeviceMapping"`
	VirtualizationType string                `xml:"virtualizationType"`
	Tags               items[xmlTag]         `xml:"tagSet"`
	Hypervisor         string                `xml:"hypervisor"`
	EnaSupport         bool                  `xml:"enaSupport"`
	BootMode           string                `xml:"bootMode,omitempty"`
	ImdsSupport        string                `xml:"imdsSupport,omitempty"`
	PlatformDetails    string                `xml:"platformDetails"`
	UsageOperation     string                `xml:"usageOperation"`
	StateReason        *xmlStateReason       `xml:"stateReason,omitempty"`
}

type xmlSnapshot struct {
	SnapshotID  string        `xml:"snapshotId"`
	VolumeID    string        `xml:"volumeId"`
	Status      string        `xml:"status"`
	StartTime   ts            `xml:"startTime"`
	Progress    string        `xml:"progress"`
	OwnerID     string        `xml:"ownerId"`
	VolumeSize  int           `xml:"volumeSize"`
	Description string        `xml:"description"`
	Encrypted   bool          `xml:"encrypted"`
	StorageTier string        `xml:"storageTier"`
	Tags        items[xmlTag] `xml:"tagSet"`
}

type xmlVolumeAttachment struct {
	VolumeID            string `xml:"volumeId"`
	InstanceID          string `xml:"instanceId"`
	Device              string `xml:"device"`
	Status              string `xml:"status"`
	AttachTime          ts     `xml:"attachTime"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
}

type xmlVolume struct {
	VolumeID    string                     `xml:"volumeId"`
	Size        int                        `xml:"size"`
	SnapshotID  string                     `xml:"snapshotId"`
	AZ          string                     `xml:"availabilityZone"`
	Status      string                     `xml:"status"`
	CreateTime  ts                         `xml:"createTime"`
	Attachments items[xmlVolumeAttachment] `xml:"attachmentSet"`
	Tags        items[xmlTag]              `xml:"tagSet"`
	VolumeType  string                     `xml:"volumeType"`
	Iops        int                        `xml:"iops,omitempty"`
	Throughput  int                        `xml:"throughput,omitempty"`
	Encrypted   bool                       `xml:"encrypted"`
	MultiAttach bool                       `xml:"multiAttachEnabled"`
}

type xmlUserBucket struct {
	S3Bucket string `xml:"s3Bucket"`
	S3Key    string `xml:"s3Key"`
}

type xmlSnapshotTaskDetail struct {
	Description   string         `xml:"description,omitempty"`
	DiskImageSize float64        `xml:"diskImageSize,omitempty"`
	Format        string         `xml:"format,omitempty"`
	Progress      string         `xml:"progress,omitempty"`
	SnapshotID    string         `xml:"snapshotId,omitempty"`
	Status        string         `xml:"status"`
	StatusMessage string         `xml:"statusMessage,omitempty"`
	URL           string         `xml:"url,omitempty"`
	UserBucket    *xmlUserBucket `xml:"userBucket,omitempty"`
	Encrypted     bool           `xml:"encrypted"`
}

type xmlSnapshotDetail struct {
	Description   string         `xml:"description,omitempty"`
	DeviceName    string         `xml:"deviceName,omitempty"`
	DiskImageSize float64        `xml:"diskImageSize,omitempty"`
	Format        string         `xml:"format,omitempty"`
	Progress      string         `xml:"progress,omitempty"`
	SnapshotID    string         `xml:"snapshotId,omitempty"`
	Status        string         `xml:"status"`
	StatusMessage string         `xml:"statusMessage,omitempty"`
	UserBucket    *xmlUserBucket `xml:"userBucket,omitempty"`
}
