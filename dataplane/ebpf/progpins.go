package ebpf

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Program reuse across restarts.
//
// Loading the programs runs the verifier over each of them, which takes
// most of a start. So the loaded programs are pinned in progDir, each
// under a name that carries the fingerprint of the load (programFingerprint),
// and a later start takes the pinned ones instead of loading them again,
// but only when that is provably what a fresh load would give: the
// fingerprint matches (the same ELF object, loaded the same way by the
// same library on the same kernel), and each program uses exactly the
// maps this start loaded (a program never outlives a replaced map: a
// layout change, a resize, an unpinned conntrack table). Anything else
// loads fresh programs and replaces the pins.
//
// A pin name carries the fingerprint, so a set of pins never mixes two
// kinds of program: a crash while pins are replaced leaves at worst an
// incomplete set, which the next start does not reuse.

// progDirName is the directory of the program pins, under the bpffs dir.
const progDirName = "progs"

// progFingerprintVersion changes when what the fingerprint covers does.
const progFingerprintVersion = "vipd-progs-1"

// progFingerprintLen is how many hex digits of the fingerprint a pin
// name carries (128 bits).
const progFingerprintLen = 32

// programFingerprint is a SHA-256 of everything a load of spec's programs
// depends on besides their maps: the embedded object (which holds the
// programs' code, types, license and sections), the programs loaded, the
// map sizes vipd sets, the library that loads them (which rewrites
// instructions: CO-RE, kfuncs, feature fallbacks) and the kernel that
// verifies and JITs them (its release and build). obj is the bpf2go object.
func programFingerprint(obj []byte, spec *ebpf.CollectionSpec) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", progFingerprintVersion)
	sum := sha256.Sum256(obj)
	fmt.Fprintf(h, "object %x\n", sum)
	for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
		p := spec.Programs[name]
		fmt.Fprintf(h, "program %s %v %v %d\n", name, p.Type, p.AttachType, len(p.Instructions))
	}
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		m := spec.Maps[name]
		fmt.Fprintf(h, "map %s %v %d %d %d %d %d\n", name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, m.Pinning)
	}
	fmt.Fprintf(h, "library %s\n", ebpfLibraryVersion())
	fmt.Fprintf(h, "arch %s\n", runtime.GOARCH)
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		fmt.Fprintf(h, "kernel %s %s\n", unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]))
	}
	return hex.EncodeToString(h.Sum(nil))[:progFingerprintLen]
}

// ebpfLibraryVersion names the cilium/ebpf module this binary was built
// with, or "unknown".
func ebpfLibraryVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/cilium/ebpf" {
			if d.Replace != nil {
				return d.Replace.Path + "@" + d.Replace.Version + " " + d.Replace.Sum
			}
			return d.Version + " " + d.Sum
		}
	}
	return "unknown"
}

// progPin is the pin of the program name loaded with fingerprint fp.
func progPin(dir, fp, name string) string {
	return filepath.Join(dir, progDirName, fp+"_"+name)
}

// taggedFields returns the fields of *objs, a struct of bpf2go's whose
// fields are *T with an `ebpf` tag, by their tags: their objects' names.
func taggedFields[T any](objs any) map[string]**T {
	out := map[string]**T{}
	v := reflect.ValueOf(objs).Elem()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Tag.Get("ebpf"); name != "" {
			out[name] = v.Field(i).Addr().Interface().(**T)
		}
	}
	return out
}

// mapFields returns the map fields of maps by the names of their maps.
func mapFields(maps *bpfMaps) map[string]**ebpf.Map { return taggedFields[ebpf.Map](maps) }

// programFields returns the program fields of progs by the names of their
// programs.
func programFields(progs *bpfPrograms) map[string]**ebpf.Program {
	return taggedFields[ebpf.Program](progs)
}

// mapRefs returns the names of the maps the program p refers to.
func mapRefs(p *ebpf.ProgramSpec, maps map[string]*ebpf.MapSpec) []string {
	var refs []string
	for _, ins := range p.Instructions {
		if r := ins.Reference(); r != "" && ins.IsLoadFromMap() && maps[r] != nil && !slices.Contains(refs, r) {
			refs = append(refs, r)
		}
	}
	slices.Sort(refs)
	return refs
}

// kernelObjName is name as the kernel keeps it (BPF_OBJ_NAME_LEN).
func kernelObjName(name string) string {
	if len(name) > unix.BPF_OBJ_NAME_LEN-1 {
		return name[:unix.BPF_OBJ_NAME_LEN-1]
	}
	return name
}

// reusePrograms returns the programs pinned in dir with fingerprint fp,
// if they are exactly what a load of spec over loaded would give: every
// program of bpfPrograms is pinned, of its type and name, and uses the
// maps it refers to in spec, loaded's own for the pinned maps. A map that is
// not pinned (a per-CPU scratch map, which each load creates anew) is
// taken from the pinned programs, which must all use the same one, of
// spec's shape: it replaces the one in loaded. When the programs cannot be
// reused, it returns why, and nothing changes.
func reusePrograms(dir, fp string, spec *ebpf.CollectionSpec, loaded *bpfMaps) (*bpfPrograms, string) {
	var progs bpfPrograms
	fields := programFields(&progs)
	mfields := mapFields(loaded)
	ids := map[string]ebpf.MapID{}
	for name, f := range mfields {
		if spec.Maps[name] == nil || spec.Maps[name].Pinning != ebpf.PinByName {
			continue
		}
		info, err := (*f).Info()
		if err != nil {
			return nil, fmt.Sprintf("map %s info: %v", name, err)
		}
		ids[name], _ = info.ID()
	}
	unpinned := map[string]ebpf.MapID{} // the unpinned maps the pinned programs use
	fail := func(reason string) (*bpfPrograms, string) {
		progs.Close()
		return nil, reason
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		ps := spec.Programs[name]
		if ps == nil {
			return fail("program " + name + " missing from the object")
		}
		p, err := ebpf.LoadPinnedProgram(progPin(dir, fp, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			return fail("program " + name + " of this build is not pinned")
		}
		if err != nil {
			return fail(fmt.Sprintf("load pinned program %s: %v", name, err))
		}
		*fields[name] = p
		info, err := p.Info()
		if err != nil {
			return fail(fmt.Sprintf("pinned program %s info: %v", name, err))
		}
		// The library names a program by its BTF function, else by the
		// kernel's truncated name.
		if info.Type != ps.Type || (info.Name != name && info.Name != kernelObjName(name)) {
			return fail(fmt.Sprintf("pin of program %s holds program %q of type %v", name, info.Name, info.Type))
		}
		used, ok := info.MapIDs()
		if !ok {
			return fail("the kernel does not tell the maps of pinned program " + name)
		}
		left := map[ebpf.MapID]bool{}
		for _, id := range used {
			left[id] = true
		}
		for _, ref := range mapRefs(ps, spec.Maps) {
			if id, ok := ids[ref]; ok {
				if !left[id] {
					return fail(fmt.Sprintf("pinned program %s does not use this start's map %s (ID %d)", name, ref, id))
				}
				delete(left, id)
				continue
			}
			// An unpinned map: find it among the program's by name. (A
			// data section, .rodata and the like, which bpfMaps does not
			// hold, would be found under no such name: never reused.)
			var found ebpf.MapID
			for id := range left {
				m, err := ebpf.NewMapFromID(id)
				if err != nil {
					return fail(fmt.Sprintf("map %d of pinned program %s: %v", id, name, err))
				}
				mi, err := m.Info()
				if err == nil && (mi.Name == ref || mi.Name == kernelObjName(ref)) {
					err = spec.Maps[ref].Compatible(m)
					if err != nil {
						m.Close()
						return fail(fmt.Sprintf("map %s of pinned program %s: %v", ref, name, err))
					}
					found = id
				}
				m.Close()
				if found != 0 {
					break
				}
			}
			if found == 0 {
				return fail(fmt.Sprintf("pinned program %s does not use a map %s", name, ref))
			}
			if prev, ok := unpinned[ref]; ok && prev != found {
				return fail(fmt.Sprintf("pinned programs use two maps %s (IDs %d and %d)", ref, prev, found))
			}
			unpinned[ref] = found
			delete(left, found)
		}
		if len(left) > 0 {
			return fail(fmt.Sprintf("pinned program %s uses %d maps this start did not load", name, len(left)))
		}
	}
	// Take the unpinned maps the programs use in place of the fresh ones.
	taken := map[string]*ebpf.Map{}
	for ref, id := range unpinned {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			for _, t := range taken {
				t.Close()
			}
			return fail(fmt.Sprintf("map %s of the pinned programs: %v", ref, err))
		}
		taken[ref] = m
	}
	for ref, m := range taken {
		if f := mfields[ref]; f != nil {
			if *f != nil {
				(*f).Close()
			}
			*f = m
		} else {
			m.Close()
		}
	}
	return &progs, ""
}

// loadPrograms loads every program of bpfPrograms from spec over maps.
// (Loading them concurrently, one per CPU, did not start vipd faster on
// a 2-CPU machine: 1.28 s one by one, 1.26 s two at a time.)
func loadPrograms(spec *ebpf.CollectionSpec, maps *bpfMaps) (*bpfPrograms, error) {
	repl := map[string]*ebpf.Map{}
	for name, f := range mapFields(maps) {
		if *f != nil {
			repl[name] = *f
		}
	}
	var progs bpfPrograms
	if err := spec.LoadAndAssign(&progs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, err
	}
	return &progs, nil
}

// pinPrograms pins progs in dir under fingerprint fp, and removes every
// other program pin there (those of earlier loads, which would keep their
// maps alive). Attached programs stay attached: their links hold them.
func pinPrograms(dir, fp string, progs *bpfPrograms) error {
	pdir := filepath.Join(dir, progDirName)
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		return fmt.Errorf("create program pin directory: %w", err)
	}
	keep := map[string]bool{}
	var errs []error
	for name, f := range programFields(progs) {
		pin := progPin(dir, fp, name)
		keep[filepath.Base(pin)] = true
		// Pinned beside, then renamed over a pin of the same name (one of
		// programs not reused, as over replaced maps): atomic.
		tmp := pin + "_new" // bpffs refuses names with dots
		os.Remove(tmp)
		if err := (*f).Pin(tmp); err != nil {
			errs = append(errs, fmt.Errorf("pin program %s: %w", name, err))
			continue
		}
		if err := os.Rename(tmp, pin); err != nil {
			os.Remove(tmp)
			errs = append(errs, fmt.Errorf("pin program %s: %w", name, err))
		}
	}
	entries, _ := os.ReadDir(pdir)
	for _, e := range entries {
		if !keep[e.Name()] {
			os.Remove(filepath.Join(pdir, e.Name()))
		}
	}
	return errors.Join(errs...)
}

// removeProgramPins removes the program pins in dir, and their directory.
func removeProgramPins(dir string) error {
	pdir := filepath.Join(dir, progDirName)
	entries, err := os.ReadDir(pdir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read program pin directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.Remove(filepath.Join(pdir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(pdir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// programsPinned reports whether every program of spec is pinned in dir
// with spec's fingerprint: an earlier start loaded them on this kernel.
func programsPinned(dir string, spec *ebpf.CollectionSpec) bool {
	fp := programFingerprint(_BpfBytes, spec)
	for name := range programFields(&bpfPrograms{}) {
		if !pinExists(progPin(dir, fp, name)) {
			return false
		}
	}
	return true
}

// loadOrReusePrograms returns the programs for maps: the pinned ones when
// reusePrograms allows, else freshly loaded ones, which it pins in their
// place. The log says which, and why.
func loadOrReusePrograms(log hclog.Logger, dir string, spec *ebpf.CollectionSpec, maps *bpfMaps) (*bpfPrograms, error) {
	fp := programFingerprint(_BpfBytes, spec)
	progs, why := reusePrograms(dir, fp, spec, maps)
	if progs != nil {
		log.Debug("reusing pinned programs", "fingerprint", fp)
		return progs, nil
	}
	log.Info("loading programs", "reason", why, "fingerprint", fp)
	progs, err := loadPrograms(spec, maps)
	if err != nil {
		return nil, err
	}
	if err := pinPrograms(dir, fp, progs); err != nil {
		// Only the next start's speed depends on the pins.
		log.Warn("cannot pin the programs: the next start loads them again", "error", err)
	}
	return progs, nil
}
