// Package servicesdir applies a directory of service files (vipd run
// --services-dir): every *.yaml, *.yml and *.json file in it, not hidden,
// in the format of "vipctl apply -f" (internal/manifest, Kubernetes
// Service and EndpointSlice manifests included, converted for the node
// Config.NodeName). Each file owns its services as the owner
// "file:<name>" (validation.FileOwner), and is synced with SyncServices
// through vipd's own API in-process, so that it is validated, reconciled
// and persisted as any client's change.
//
// The directory, not its files, is watched with fsnotify, so that files
// written in place, renamed in atomically or deleted are all seen; events
// are merged for a short debounce, and the directory is also rescanned
// periodically and on Rescan (SIGHUP). A file that does not parse or
// validate, or that claims what another file holds, keeps its last good
// version in force; it is logged once per distinct error, reported as a
// GetStatus warning (Warnings) and in the Observer, naming the file and the
// field. When two files claim the same VIP:port (or the same service
// name), the one that holds it already keeps it and the other is refused,
// naming both; between two files that claim it in the same scan, the first
// in name order wins. A file that is gone has its services deleted, also
// when it went while vipd was not running.
//
// It owns the files and their owners only: it must not validate services
// itself (vipd does), talk to the dataplane, or touch another owner's
// services.
package servicesdir
