package aws

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The EBS direct API (REST-JSON): StartSnapshot, PutSnapshotBlock,
// CompleteSnapshot, ListSnapshotBlocks. Block data is checked (length,
// SHA-256) and counted, not kept.

// ebsBlockSize is the size of every block of the EBS direct API.
const ebsBlockSize = 512 * 1024

func writeEBSError(w http.ResponseWriter, status int, code, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	body := map[string]string{"Message": msg}
	if reason != "" {
		body["Reason"] = reason
	}
	_ = json.NewEncoder(w).Encode(body)
}

type ebsTag struct {
	Key   string `json:"Key"`
	Value string `json:"Value"`
}

func ebsTags(m map[string]string) []ebsTag {
	out := []ebsTag{}
	for _, t := range tagSet(m) {
		out = append(out, ebsTag(t))
	}
	return out
}

func (c *Cloud) serveEBS(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	rid := c.requestID()
	c.mu.Unlock()
	w.Header().Set("X-Amzn-RequestId", rid)
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	op := ""
	switch {
	case r.Method == http.MethodPost && len(parts) == 1 && parts[0] == "snapshots":
		op = "StartSnapshot"
	case r.Method == http.MethodPut && len(parts) == 4 && parts[0] == "snapshots" && parts[2] == "blocks":
		op = "PutSnapshotBlock"
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "snapshots" && parts[1] == "completion":
		op = "CompleteSnapshot"
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "snapshots" && parts[2] == "blocks":
		op = "ListSnapshotBlocks"
	default:
		c.count("ebs.unknown")
		writeEBSError(w, http.StatusNotFound, "ResourceNotFoundException", "", "No EBS direct operation at "+r.Method+" "+r.URL.Path)
		return
	}
	c.count("ebs." + op)
	if c.throttled() {
		writeEBSError(w, http.StatusBadRequest, "RequestThrottledException", "ACCOUNT_THROTTLED", "Rate exceeded")
		return
	}
	now := time.Now()
	switch op {
	case "StartSnapshot":
		var in struct {
			VolumeSize  *int64   `json:"VolumeSize"`
			Description string   `json:"Description"`
			Tags        []ebsTag `json:"Tags"`
			ClientToken string   `json:"ClientToken"`
			Timeout     *int     `json:"Timeout"`
			ParentID    string   `json:"ParentSnapshotId"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in); err != nil {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_PARAMETER_VALUE", "The request body is not valid JSON: "+err.Error())
			return
		}
		if in.VolumeSize == nil || *in.VolumeSize < 1 || *in.VolumeSize > 65536 {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_VOLUME_SIZE", "VolumeSize must be from 1 to 65536 GiB")
			return
		}
		if in.ParentID != "" {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_SNAPSHOT_ID", "Incremental snapshots are not offered by this cloud")
			return
		}
		tags := map[string]string{}
		for _, t := range in.Tags {
			if t.Key == "" || strings.HasPrefix(strings.ToLower(t.Key), "aws:") {
				writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_TAG", "Tag key "+strconv.Quote(t.Key)+" is not allowed")
				return
			}
			tags[t.Key] = t.Value
		}
		c.mu.Lock()
		var s *snapshot
		if id, ok := c.tokens["ebs/"+in.ClientToken]; ok && in.ClientToken != "" {
			s = c.snapshots[id]
		}
		if s == nil {
			s = &snapshot{ID: newID("snap"), Size: int(*in.VolumeSize), State: "pending", Started: now, Description: in.Description,
				Tags: tags, Owner: c.account, Direct: true, Blocks: map[int32]bool{}}
			c.snapshots[s.ID] = s
			if in.ClientToken != "" {
				c.tokens["ebs/"+in.ClientToken] = s.ID
			}
		}
		out := map[string]any{"SnapshotId": s.ID, "OwnerId": s.Owner, "Status": "pending", "StartTime": float64(s.Started.UnixMilli()) / 1000,
			"VolumeSize": s.Size, "BlockSize": ebsBlockSize, "Tags": ebsTags(s.Tags), "Description": s.Description, "SseType": "NONE"}
		c.mu.Unlock()
		writeJSON(w, http.StatusCreated, out)
	case "PutSnapshotBlock":
		idx, err := strconv.ParseInt(parts[3], 10, 32)
		if err != nil || idx < 0 {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_BLOCK", "Block index "+parts[3]+" is not valid")
			return
		}
		if r.Header.Get("x-amz-Data-Length") != strconv.Itoa(ebsBlockSize) {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_BLOCK", "x-amz-Data-Length must be "+strconv.Itoa(ebsBlockSize))
			return
		}
		if alg := r.Header.Get("x-amz-Checksum-Algorithm"); alg != "SHA256" {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_PARAMETER_VALUE", "x-amz-Checksum-Algorithm must be SHA256")
			return
		}
		h := sha256.New()
		n, err := io.Copy(h, io.LimitReader(r.Body, ebsBlockSize+1))
		if err != nil || n != ebsBlockSize {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_BLOCK", "A block must hold exactly "+strconv.Itoa(ebsBlockSize)+" bytes")
			return
		}
		sum := base64.StdEncoding.EncodeToString(h.Sum(nil))
		if sum != r.Header.Get("x-amz-Checksum") {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_BLOCK", "The checksum of the block does not match x-amz-Checksum")
			return
		}
		c.mu.Lock()
		s := c.snapshots[parts[1]]
		switch {
		case s == nil || !s.Direct:
			c.mu.Unlock()
			writeEBSError(w, http.StatusNotFound, "ResourceNotFoundException", "SNAPSHOT_NOT_FOUND", "The snapshot "+parts[1]+" does not exist")
			return
		case s.Completed:
			c.mu.Unlock()
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_SNAPSHOT_ID", "The snapshot "+s.ID+" is completed")
			return
		case int64(idx)*ebsBlockSize >= int64(s.Size)<<30:
			c.mu.Unlock()
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_BLOCK", "Block index "+parts[3]+" is beyond the volume size")
			return
		}
		s.Blocks[int32(idx)] = true
		c.mu.Unlock()
		w.Header().Set("x-amz-Checksum", sum)
		w.Header().Set("x-amz-Checksum-Algorithm", "SHA256")
		writeJSON(w, http.StatusCreated, map[string]any{})
	case "CompleteSnapshot":
		count, err := strconv.Atoi(r.Header.Get("x-amz-ChangedBlocksCount"))
		if err != nil || count < 0 {
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_PARAMETER_VALUE", "x-amz-ChangedBlocksCount is required")
			return
		}
		c.mu.Lock()
		s := c.snapshots[parts[2]]
		if s == nil || !s.Direct {
			c.mu.Unlock()
			writeEBSError(w, http.StatusNotFound, "ResourceNotFoundException", "SNAPSHOT_NOT_FOUND", "The snapshot "+parts[2]+" does not exist")
			return
		}
		if count != len(s.Blocks) {
			c.mu.Unlock()
			writeEBSError(w, http.StatusBadRequest, "ValidationException", "INVALID_PARAMETER_VALUE", "ChangedBlocksCount "+strconv.Itoa(count)+" does not match the "+strconv.Itoa(len(s.Blocks))+" blocks written")
			return
		}
		if !s.Completed {
			s.Completed = true
			s.CompleteAt = now.Add(c.knobs.ImportTime.D() / 4)
		}
		c.mu.Unlock()
		writeJSON(w, http.StatusAccepted, map[string]any{"Status": "pending"})
	case "ListSnapshotBlocks":
		c.mu.Lock()
		s := c.snapshots[parts[1]]
		if s == nil || !s.Direct {
			c.mu.Unlock()
			writeEBSError(w, http.StatusNotFound, "ResourceNotFoundException", "SNAPSHOT_NOT_FOUND", "The snapshot "+parts[1]+" does not exist")
			return
		}
		blocks := []map[string]any{}
		for i := range s.Blocks {
			blocks = append(blocks, map[string]any{"BlockIndex": i, "BlockToken": "token-" + strconv.Itoa(int(i))})
		}
		size := s.Size
		c.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"Blocks": blocks, "VolumeSize": size, "BlockSize": ebsBlockSize})
	}
}
