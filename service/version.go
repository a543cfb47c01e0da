package service

import (
	"runtime/debug"
	"strings"
)

// BuildVersion says which build this is: the version (Version when the
// build set it with -ldflags "-X .../service.Version=...", else the module
// version Go recorded), the VCS commit and whether the tree was modified,
// as Go's build information has them.
func BuildVersion() string {
	version, commit, modified := Version, "", false
	info, ok := debug.ReadBuildInfo()
	if ok {
		if version == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	var b strings.Builder
	b.WriteString(version)
	if commit == "" {
		b.WriteString(" (commit unknown: built without VCS information)")
	} else {
		b.WriteString(" (commit " + commit)
		if modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	if ok {
		b.WriteString(" " + info.GoVersion)
	}
	return b.String()
}
