package cli

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// applyOptions are the flags of apply that shape the calls to vipd.
type applyOptions struct {
	owner         string
	prune         bool
	takeOwnership bool
	dryRun        bool
}

func (a *App) applyCommand() *cobra.Command {
	var (
		files    []string
		opts     applyOptions
		nodeName string
		cmd      *cobra.Command
	)
	cmd = &cobra.Command{
		Use:   "apply -f FILE [-f FILE...]",
		Short: "Create or replace the services in files",
		Long: `Create or replace the services in files ("-" is standard input).

A file is YAML or JSON and holds one service, a list of services, or
{services: [...]}; YAML files may hold several documents separated by "---".
A service is vipd.v1.Service in its JSON form, for example:

  name: default/web
  vips: [10.96.0.10]
  ports:
  - {name: http, protocol: tcp, port: 80, targetPort: 8080}
  backends:
  - {ip: 10.0.1.5}
  - {ip: 10.0.2.7, state: terminating}
  sessionAffinity: {mode: client-ip}

Field names may be written in lowerCamel (targetPort), as vipctl -o json and
grpcurl print them, or as in the .proto (target_port). Enums take their full
names (PROTOCOL_UDP) or short ones, in any case and with "-" or "_":
protocol tcp, udp, sctp; state ready, terminating, not-serving; session
affinity mode none, client-ip; internalTrafficPolicy and
externalTrafficPolicy cluster, local; loadBalancing random, maglev;
trafficDistribution prefer-same-zone, prefer-same-node.
Unknown fields are errors, named by document and path. The output of "vipctl service get -o yaml" and "vipctl service list
-o json" reads back.

Files may also hold Kubernetes Services (v1) and EndpointSlices
(discovery.k8s.io/v1), alone or in a List, as "kubectl get
svc,endpointslices -A -o yaml" prints them, and mixed with vipd services.
They are converted as vipd's Kubernetes adapter converts them: the service
namespace/name with the Service's cluster IPs and ports, and as backends the
endpoints of its EndpointSlices (in any of the files), each with the port
numbers its slice gives, and no owner (--owner gives one). Unknown fields
are errors; a missing namespace is "default". --node-name names this node,
whose endpoints are node-local (internalTrafficPolicy: Local). What
kube-proxy would not program either (headless and ExternalName Services,
Services with the label service.kubernetes.io/service-proxy-name) and
EndpointSlices of no Service in the files are left out, with a note on
standard error.

Each service prints "service/NAME created", "configured" or "unchanged".
Nothing is written unless every service passes: vipd first checks each one
(validate_only) against its current state, conflicts with other services
included, and two services of the files that claim the same VIP:port,
external or load-balancer IP:port or node port, or an address that one
uses in a role another's excludes (a backend that is a VIP, an external or
load-balancer IP that is a VIP or a backend), are an error too. Errors
name the file, document and field. Services are written one by one in the
order of the files, so a service may take a VIP:port, a node port or an
address that an earlier one gives up: that conflict is not an error, and what vipd checks after it
(the service's other conflicts, limits) is checked when it is written.
vipd checks each service alone and does not report its limits, so limits
on totals (vipd --max-services, --max-total-backends) are not checked for
the files as a whole. A failure while writing (a limit reached, a
conflict that the check could not see, another client that wrote
meanwhile, a change the kernel refused) stops apply part way: the
services before the failing one stay applied, and apply names them, as
in "1 of 2 services were applied: a". --dry-run stops after the check and
prints what would happen.

A service that carries generation (as "vipctl service get -o yaml" prints
it) is written only if vipd's copy still has that generation: a stale file
fails (exit code 5) instead of undoing newer changes. Remove generation to
overwrite regardless.

A service keeps its owner: without --owner, a service that names no owner
keeps the stored one (or gets "default" when new). --owner fills in an empty
owner, and a service with another owner is an error. A service that would
move to another owner fails (exit code 5) unless --take-ownership is given.

With --prune (which needs --owner), one atomic call makes the owner's
services exactly those in the files, deleting the owner's other services;
other owners' services are never touched, and it prints "deleted" too.
SyncServices takes no generations: with --prune, generations are checked
just before that call, not in it, so a change that another client makes
in between is not noticed.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ []string) error {
			if opts.prune && opts.owner == "" {
				return usageErrorf("--prune needs --owner, whose services not in the files it deletes")
			}
			if opts.prune && opts.takeOwnership {
				return usageErrorf("--take-ownership does not apply to --prune, which never takes over another owner's service")
			}
			if !cmd.Flags().Changed("node-name") {
				nodeName = defaultNodeName()
			}
			docs, err := a.loadDocuments(manifest.Options{NodeName: nodeName}, files, opts.owner)
			if err != nil {
				return err
			}
			return a.withClient(func(c *client.Client) error {
				if opts.prune {
					return a.sync(ctx, c, docs, opts)
				}
				if err := claimConflicts(docs); err != nil {
					return err
				}
				return a.upsertAll(ctx, c, docs, opts)
			})
		}),
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `file of services, "-" for standard input; repeatable`)
	cmd.Flags().StringVar(&opts.owner, "owner", "", "owner of the services")
	cmd.Flags().BoolVar(&opts.prune, "prune", false, "also delete the owner's services that the files do not list")
	cmd.Flags().BoolVar(&opts.takeOwnership, "take-ownership", false, "move services that another owner has to the owner of the file or --owner")
	cmd.Flags().BoolVar(&opts.dryRun, "dry-run", false, "check every service with vipd and print what would happen, changing nothing")
	cmd.Flags().StringVar(&nodeName, "node-name", "", "Kubernetes files: this node's name; endpoints with this nodeName are node-local "+
		"(default $"+NodeNameEnv+", else the host name in lower case)")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

// document is one service of the input files, ready to send.
type document struct {
	svc    *vipdv1.Service
	origin manifest.Origin
	// generation is the generation the file gave the service, which apply
	// sends as the expected generation; 0 if none.
	generation uint64
}

// error places err, about field of the document's service (a path in
// vipd.v1.Service, or "" for the whole service), in the file.
func (d document) error(field string, err error) *manifest.Error {
	return d.origin.Error(d.svc.GetName(), field, err)
}

// loadDocuments reads the services of files with opts, in order
// (Kubernetes objects, converted once all files are read, come after the
// vipd services), prints the loader's notes on what it left out to the
// error stream, and prepares the services for vipd: owner fills in an
// empty owner, and the output-only generation (present in what "service
// get -o yaml" prints) moves to document.generation.
func (a *App) loadDocuments(opts manifest.Options, files []string, owner string) ([]document, error) {
	l := manifest.NewLoader(opts)
	for _, f := range files {
		var err error
		if f == "-" {
			err = l.Read(a.streams.In, manifest.Stdin)
		} else {
			err = l.ReadFile(f)
		}
		if err != nil {
			return nil, err
		}
	}
	res, err := l.Result()
	if err != nil {
		return nil, err
	}
	for _, note := range res.Notes {
		fmt.Fprintf(a.streams.Err, "note: %s\n", note)
	}
	docs := make([]document, len(res.Services))
	seen := map[string]document{}
	for i, s := range res.Services {
		d := document{svc: s, origin: res.Origins[i], generation: s.GetGeneration()}
		if first, dup := seen[s.GetName()]; dup {
			return nil, &inputError{err: d.error("", fmt.Errorf("service %q appears more than once in the files (first in %s: document %d)",
				s.GetName(), first.origin.Source, first.origin.Document))}
		}
		seen[s.GetName()] = d
		s.Generation = 0
		switch {
		case owner == "":
		case s.GetOwner() == "":
			s.Owner = owner
		case s.GetOwner() != owner:
			return nil, &inputError{err: d.error("owner", fmt.Errorf("%q is not --owner %q", s.GetOwner(), owner))}
		}
		docs[i] = d
	}
	return docs, nil
}

// claimConflicts finds two documents that claim the same VIP:port and
// protocol, external or load-balancer IP:port and protocol, or node port
// and protocol (a health-check node port is a TCP one), or an address that
// is a VIP or a backend of one and an external or load-balancer IP of
// another, or a backend of one that is a VIP of another. vipd checks each
// document against what it stores, so it would accept both in the check
// before the write, and then refuse the second after writing the first.
func claimConflicts(docs []document) error {
	type claim struct {
		kind     string // "" for a VIP, "external", "node port"
		addr     netip.Addr
		port     uint32
		protocol vipdv1.Protocol
	}
	type use struct {
		d    document
		role string // "VIP", "backend", "external IP", "load-balancer IP"
	}
	claims := map[claim]document{}
	conflict := func(d document, field, format string, args ...any) error {
		return &inputError{err: d.error(field, fmt.Errorf(format+"; nothing was applied", args...))}
	}
	protocolOf := func(p *vipdv1.Port) vipdv1.Protocol {
		if p.GetProtocol() == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
			return vipdv1.Protocol_PROTOCOL_TCP
		}
		return p.GetProtocol()
	}
	take := func(d document, field string, c claim) error {
		if first, ok := claims[c]; ok && first.svc.GetName() != d.svc.GetName() {
			what := fmt.Sprintf("%s:%d/%s", c.addr, c.port, protocolString(c.protocol))
			if c.kind == "node port" {
				what = fmt.Sprintf("node port %d/%s", c.port, protocolString(c.protocol))
			}
			return conflict(d, field, "%s is also claimed by service %q (%s: document %d)",
				what, first.svc.GetName(), first.origin.Source, first.origin.Document)
		}
		claims[c] = d
		return nil
	}
	for _, d := range docs {
		for i, vip := range d.svc.GetVips() {
			addr, err := netip.ParseAddr(vip)
			if err != nil {
				continue // vipd names the field
			}
			addr = addr.Unmap()
			for _, p := range d.svc.GetPorts() {
				if err := take(d, fmt.Sprintf("vips[%d]", i), claim{"", addr, p.GetPort(), protocolOf(p)}); err != nil {
					return err
				}
			}
		}
		for _, l := range []struct {
			name  string
			addrs []string
		}{{"external_ips", d.svc.GetExternalIps()}, {"load_balancer_ips", d.svc.GetLoadBalancerIps()}} {
			for i, s := range l.addrs {
				addr, err := netip.ParseAddr(s)
				if err != nil {
					continue
				}
				addr = addr.Unmap()
				for _, p := range d.svc.GetPorts() {
					if err := take(d, fmt.Sprintf("%s[%d]", l.name, i), claim{"external", addr, p.GetPort(), protocolOf(p)}); err != nil {
						return err
					}
				}
			}
		}
		for i, p := range d.svc.GetPorts() {
			if p.GetNodePort() != 0 {
				if err := take(d, fmt.Sprintf("ports[%d].node_port", i), claim{"node port", netip.Addr{}, p.GetNodePort(), protocolOf(p)}); err != nil {
					return err
				}
			}
		}
		if hc := d.svc.GetHealthCheckNodePort(); hc != 0 {
			if err := take(d, "health_check_node_port", claim{"node port", netip.Addr{}, hc, vipdv1.Protocol_PROTOCOL_TCP}); err != nil {
				return err
			}
		}
	}
	// Each document's addresses are checked against the roles the
	// documents before it give them, so that the later of two is named.
	excludes := map[string][]string{
		"VIP":              {"backend", "external IP", "load-balancer IP"},
		"backend":          {"VIP", "external IP", "load-balancer IP"},
		"external IP":      {"VIP", "backend"},
		"load-balancer IP": {"VIP", "backend"},
	}
	article := func(role string) string {
		if role == "external IP" {
			return "an"
		}
		return "a"
	}
	earlier := map[netip.Addr][]use{}
	for _, d := range docs {
		type addrUse struct {
			field, addr, role string
		}
		var uses []addrUse
		for i, v := range d.svc.GetVips() {
			uses = append(uses, addrUse{fmt.Sprintf("vips[%d]", i), v, "VIP"})
		}
		for i, b := range d.svc.GetBackends() {
			uses = append(uses, addrUse{fmt.Sprintf("backends[%d].ip", i), b.GetIp(), "backend"})
		}
		for i, a := range d.svc.GetExternalIps() {
			uses = append(uses, addrUse{fmt.Sprintf("external_ips[%d]", i), a, "external IP"})
		}
		for i, a := range d.svc.GetLoadBalancerIps() {
			uses = append(uses, addrUse{fmt.Sprintf("load_balancer_ips[%d]", i), a, "load-balancer IP"})
		}
		for _, u := range uses {
			addr, err := netip.ParseAddr(u.addr)
			if err != nil {
				continue
			}
			for _, e := range earlier[addr.Unmap()] {
				if slices.Contains(excludes[u.role], e.role) {
					return conflict(d, u.field, "%s is %s %s of service %q (%s: document %d), which cannot be %s %s",
						addr.Unmap(), article(e.role), e.role, e.d.svc.GetName(), e.d.origin.Source, e.d.origin.Document, article(u.role), u.role)
				}
			}
		}
		for _, u := range uses {
			if addr, err := netip.ParseAddr(u.addr); err == nil {
				earlier[addr.Unmap()] = append(earlier[addr.Unmap()], use{d, u.role})
			}
		}
	}
	return nil
}

// upsertRequest is the UpsertService request of d.
func (d document) upsertRequest(opts applyOptions, validateOnly bool) *vipdv1.UpsertServiceRequest {
	return &vipdv1.UpsertServiceRequest{
		Service:            d.svc,
		ExpectedGeneration: d.generation,
		TakeOwnership:      opts.takeOwnership,
		ValidateOnly:       validateOnly,
	}
}

// upsertAll has vipd check every document, then, unless it rejected one or
// this is a dry run, writes them one by one, reporting each as it goes in
// table mode.
//
// vipd checks each document against the services it has now, not as the
// earlier documents will leave them. So a document whose only objection is
// a conflict with a service that an earlier document replaces (a VIP or
// backend that moves from one service to another, in that order) is
// deferred: claimConflicts has made sure that the earlier document no
// longer holds what this one takes, so the conflict is gone once it is
// written, and vipd checks the rest of this one when it is written. A
// conflict with a later document is an error, as writing in order would be.
func (a *App) upsertAll(ctx context.Context, c *client.Client, docs []document, opts applyOptions) error {
	lb := c.LoadBalancerClient()
	var (
		rejected fileErrors
		failed   int
	)
	at := make(map[string]int, len(docs))
	for i, d := range docs {
		at[d.svc.GetName()] = i
	}
	checked := make([]*vipdv1.UpsertServiceResponse, len(docs))
	notes := make([]string, len(docs))
	for i, d := range docs {
		resp, err := lb.UpsertService(ctx, d.upsertRequest(opts, true))
		if err != nil {
			if holder, ok := heldByEarlier(err, i, at); ok {
				resp, err = a.deferred(ctx, c, d)
				if err != nil {
					return err
				}
				notes[i] = fmt.Sprintf(" (dry run, once service %s is written)", holder)
			}
		}
		if err != nil {
			if !aboutTheService(err) && !overLimit(err) {
				return err
			}
			rejected.add(a.placeError(ctx, c, d, opts, err))
			failed++
			continue
		}
		checked[i] = resp
	}
	if len(rejected.errs) > 0 && len(docs) == 1 {
		return &rejected
	}
	if len(rejected.errs) > 0 {
		rejected.summary = fmt.Sprintf("nothing was applied: vipd rejected %d of %d services (%s)", failed, len(docs), status.Code(rejected.cause))
		return &rejected
	}
	if opts.dryRun {
		for i := range notes {
			if notes[i] == "" {
				notes[i] = " (dry run)"
			}
		}
		return a.showApplied(checked, notes)
	}
	p := a.printer()
	var stored []*vipdv1.UpsertServiceResponse
	for _, d := range docs {
		resp, err := lb.UpsertService(ctx, d.upsertRequest(opts, false))
		if err != nil {
			return a.partial(ctx, c, d, opts, err, stored, len(docs))
		}
		stored = append(stored, resp)
		if p.format == outputTable {
			fmt.Fprintln(p.w, appliedLine(resp, ""))
		}
	}
	if p.format == outputTable {
		return nil
	}
	return a.showApplied(stored, nil)
}

// Conflicts as vipd words them (store.ConflictError and the address
// conflict violations of the server package), which name the service that
// holds the VIP:port, external address:port, node port or address.
var (
	claimHolderRE = regexp.MustCompile(`is already used by service (\S+)(?: \(its [^()]+\))?$`)
	addrHolderRE  = regexp.MustCompile(`^\S+ is an? (?:VIP|backend|external IP|load-balancer IP) of service (\S+); (?:a VIP that vipd serves cannot be a backend|an external or load-balancer IP cannot be a (?:VIP that vipd serves|backend))$`)
)

// heldByEarlier reports whether err, vipd's objection to docs[i] in the
// check, is nothing but a conflict with a service that an earlier
// document replaces (at gives each document's position by service name),
// and returns that service's name. Every other objection, field errors
// above all, is not: vipd checks fields, owners and generations before
// conflicts, so they would have been reported instead.
func heldByEarlier(err error, i int, at map[string]int) (string, bool) {
	var holders []string
	switch status.Code(err) {
	case codes.AlreadyExists:
		m := claimHolderRE.FindStringSubmatch(status.Convert(err).Message())
		if m == nil {
			return "", false
		}
		holders = append(holders, m[1])
	case codes.InvalidArgument:
		vs := client.FieldViolations(err)
		for _, v := range vs {
			m := addrHolderRE.FindStringSubmatch(v.GetDescription())
			if m == nil {
				return "", false
			}
			holders = append(holders, m[1])
		}
	}
	if len(holders) == 0 {
		return "", false
	}
	for _, h := range holders {
		if j, ok := at[h]; !ok || j >= i {
			return "", false
		}
	}
	return holders[0], true
}

// deferred stands for vipd's answer to the check of d, which heldByEarlier
// deferred to the write: d as the file has it, created or configured as
// vipd has it now.
func (a *App) deferred(ctx context.Context, c *client.Client, d document) (*vipdv1.UpsertServiceResponse, error) {
	resp := &vipdv1.UpsertServiceResponse{Service: d.svc, Result: vipdv1.UpsertResult_UPSERT_RESULT_CONFIGURED}
	_, err := c.GetService(ctx, d.svc.GetName())
	switch {
	case client.IsNotFound(err):
		resp.Result = vipdv1.UpsertResult_UPSERT_RESULT_CREATED
	case err != nil:
		return nil, err
	}
	return resp, nil
}

// partial is the error of apply when vipd refused to write d, after it
// wrote the services of stored, out of total: d's error placed in its file,
// and, when there were several, which were applied. vipd's "nothing was
// changed" is about d alone, and is said so.
func (a *App) partial(ctx context.Context, c *client.Client, d document, opts applyOptions, err error, stored []*vipdv1.UpsertServiceResponse, total int) error {
	about := aboutTheService(err) || overLimit(err)
	if total == 1 {
		if !about {
			return fmt.Errorf("apply service %s: %w", d.svc.GetName(), err)
		}
		return a.placeError(ctx, c, d, opts, err)
	}
	var fe *fileErrors
	if about {
		fe = a.placeError(ctx, c, d, opts, err)
	} else {
		// Placed too, so that the summary below is not lost to diagnose.
		fe = &fileErrors{cause: err, errs: []*manifest.Error{d.error("", errors.New(describe(err)))}}
	}
	if len(stored) > 0 {
		for _, e := range fe.errs {
			if msg, ok := strings.CutSuffix(e.Err.Error(), "; nothing was changed"); ok {
				e.Err = fmt.Errorf("%s; service %s was not changed", msg, d.svc.GetName())
			}
		}
	}
	names := make([]string, len(stored))
	for i, r := range stored {
		names[i] = r.GetService().GetName()
	}
	fe.summary = fmt.Sprintf("%d of %d services were applied", len(stored), total)
	if len(names) > 0 {
		fe.summary += ": " + strings.Join(names, ", ")
	}
	return fe
}

// showApplied prints the results of upserts: a line each for -o table,
// with notes[i] (if any) after the line of results[i], else the services
// as "service list" does.
func (a *App) showApplied(results []*vipdv1.UpsertServiceResponse, notes []string) error {
	svcs := make([]*vipdv1.Service, len(results))
	for i, r := range results {
		svcs[i] = r.GetService()
	}
	return a.printer().show(&vipdv1.ListServicesResponse{Services: svcs}, func(t *table) {
		for i, r := range results {
			note := ""
			if i < len(notes) {
				note = notes[i]
			}
			t.row(appliedLine(r, note))
		}
	})
}

// appliedLine is "service/NAME created (generation N)", as kubectl says it,
// with note in place of the generation when there is one.
func appliedLine(r *vipdv1.UpsertServiceResponse, note string) string {
	verb := "configured" // what a vipd too old to say means
	switch r.GetResult() {
	case vipdv1.UpsertResult_UPSERT_RESULT_CREATED:
		verb = "created"
	case vipdv1.UpsertResult_UPSERT_RESULT_UNCHANGED:
		verb = "unchanged"
	}
	if note == "" {
		note = fmt.Sprintf(" (generation %d)", r.GetService().GetGeneration())
	}
	return fmt.Sprintf("service/%s %s%s", r.GetService().GetName(), verb, note)
}

// aboutTheService reports whether err is vipd's objection to one service,
// rather than a failure to ask it, after which checking the next service
// is pointless.
func aboutTheService(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted, codes.NotFound, codes.OutOfRange:
		return true
	}
	return false
}

// overLimit reports whether err is vipd's refusal of a service that would
// take it past a limit on totals (--max-services, --max-total-backends),
// which carries a QuotaFailure, rather than of a call (too many requests in
// progress), which does not.
func overLimit(err error) bool {
	if status.Code(err) != codes.ResourceExhausted {
		return false
	}
	for _, d := range status.Convert(err).Details() {
		if _, ok := d.(*errdetails.QuotaFailure); ok {
			return true
		}
	}
	return false
}

// placeError turns vipd's objection to d into errors placed in the file: a
// field violation each, a stale generation explained, and a refused change
// of owner named with the flag that allows it.
func (a *App) placeError(ctx context.Context, c *client.Client, d document, opts applyOptions, err error) *fileErrors {
	fe := &fileErrors{cause: err}
	if v := client.FieldViolations(err); len(v) > 0 {
		for _, fv := range v {
			field, ok := strings.CutPrefix(fv.GetField(), "service.")
			if !ok && fv.GetField() != "service" {
				// A field of the request, such as expected_generation.
				fe.errs = append(fe.errs, d.error("", fmt.Errorf("%s: %s", fv.GetField(), fv.GetDescription())))
				continue
			}
			if field == "service" {
				field = ""
			}
			fe.errs = append(fe.errs, d.error(field, errors.New(fv.GetDescription())))
		}
		return fe
	}
	msg := describe(err)
	switch status.Code(err) {
	case codes.Aborted:
		if d.generation != 0 {
			msg = a.staleMessage(ctx, c, d)
		}
	case codes.FailedPrecondition:
		if m, ok := a.ownerMessage(ctx, c, d, opts); ok {
			msg = m
		}
	}
	fe.errs = append(fe.errs, d.error("", errors.New(msg)))
	return fe
}

// staleMessage says that d's generation is not vipd's.
func (a *App) staleMessage(ctx context.Context, c *client.Client, d document) string {
	now := "which no longer exists"
	if cur, err := c.GetService(ctx, d.svc.GetName()); err == nil {
		now = fmt.Sprintf("which vipd now has at generation %d", cur.GetGeneration())
	}
	return fmt.Sprintf("the file is stale: it holds generation %d of service %s, %s; get the service again, or remove generation from the file to overwrite it",
		d.generation, d.svc.GetName(), now)
}

// ownerMessage says, when vipd refused d because the service has another
// owner, who owns it and what allows the move.
func (a *App) ownerMessage(ctx context.Context, c *client.Client, d document, opts applyOptions) (string, bool) {
	cur, err := c.GetService(ctx, d.svc.GetName())
	if opts.takeOwnership || err != nil || d.svc.GetOwner() == "" || cur.GetOwner() == d.svc.GetOwner() {
		return "", false
	}
	return fmt.Sprintf("service %s is owned by %q, not %q: apply --take-ownership moves it", d.svc.GetName(), cur.GetOwner(), d.svc.GetOwner()), true
}

// sync makes owner's services exactly those of docs and reports what
// changed; with --dry-run, vipd only checks the sync. A document that
// carries a generation must match vipd's, checked just before the sync
// (see checkGenerations).
func (a *App) sync(ctx context.Context, c *client.Client, docs []document, opts applyOptions) error {
	if err := a.checkGenerations(ctx, c, docs); err != nil {
		return err
	}
	svcs := make([]*vipdv1.Service, len(docs))
	for i, d := range docs {
		svcs[i] = d.svc
	}
	resp, err := c.LoadBalancerClient().SyncServices(ctx, &vipdv1.SyncServicesRequest{Owner: opts.owner, Services: svcs, ValidateOnly: opts.dryRun})
	if err != nil {
		if v := client.FieldViolations(err); len(v) > 0 {
			return placeSyncViolations(docs, err)
		}
		return fmt.Errorf("sync services of owner %s: %w", opts.owner, err)
	}
	note := ""
	if opts.dryRun {
		note = " (dry run)"
	}
	return a.printer().show(resp, func(t *table) {
		classes := []struct {
			verb  string
			names []string
		}{
			{"created", resp.GetCreated()},
			{"configured", resp.GetUpdated()},
			{"deleted", resp.GetDeleted()},
			{"unchanged", resp.GetUnchanged()},
		}
		for _, class := range classes {
			for _, name := range class.names {
				t.row(fmt.Sprintf("service/%s %s%s", name, class.verb, note))
			}
		}
		t.row(fmt.Sprintf("owner %s: %d created, %d configured, %d deleted, %d unchanged%s", opts.owner,
			len(resp.GetCreated()), len(resp.GetUpdated()), len(resp.GetDeleted()), len(resp.GetUnchanged()), note))
	})
}

// checkGenerations fails when a document's generation is not that of
// vipd's copy of the service, whoever owns it. SyncServices takes no
// generations, so this is checked just before it, not in the same
// transaction: a change that another client makes in between is not seen.
func (a *App) checkGenerations(ctx context.Context, c *client.Client, docs []document) error {
	var stale fileErrors
	var current map[string]*vipdv1.Service
	for _, d := range docs {
		if d.generation == 0 {
			continue
		}
		if current == nil {
			// Every owner's: a service of the files may be stored under
			// another owner, and then it exists, which the sync will say.
			svcs, err := c.ListServices(ctx, "")
			if err != nil {
				return err
			}
			current = map[string]*vipdv1.Service{}
			for _, s := range svcs {
				current[s.GetName()] = s
			}
		}
		cur := current[d.svc.GetName()]
		if have := cur.GetGeneration(); have != d.generation {
			if stale.cause == nil {
				stale.cause = status.Errorf(codes.Aborted, "service %s: expected generation %d, but it is at generation %d", d.svc.GetName(), d.generation, have)
			}
			now := "which no longer exists"
			switch {
			case cur == nil:
			case cur.GetOwner() != d.svc.GetOwner():
				now = fmt.Sprintf("which vipd now has at generation %d, under owner %q", have, cur.GetOwner())
			default:
				now = fmt.Sprintf("which vipd now has at generation %d", have)
			}
			stale.errs = append(stale.errs, d.error("", fmt.Errorf("the file is stale: it holds generation %d of service %s, %s; get the service again, or remove generation from the file to overwrite it",
				d.generation, d.svc.GetName(), now)))
		}
	}
	if len(stale.errs) > 0 {
		stale.summary = "nothing was applied (Aborted)"
		return &stale
	}
	return nil
}

// placeSyncViolations places the field violations of a SyncServices, on
// services[i].FIELD, in the documents.
func placeSyncViolations(docs []document, err error) error {
	fe := &fileErrors{cause: err, summary: fmt.Sprintf("nothing was applied (%s)", status.Code(err))}
	for _, fv := range client.FieldViolations(err) {
		var i int
		var rest string
		if n, _ := fmt.Sscanf(fv.GetField(), "services[%d]", &i); n == 1 && i >= 0 && i < len(docs) {
			_, rest, _ = strings.Cut(fv.GetField(), "]")
			fe.errs = append(fe.errs, docs[i].error(strings.TrimPrefix(rest, "."), errors.New(fv.GetDescription())))
			continue
		}
		fe.errs = append(fe.errs, &manifest.Error{Source: "request", Path: fv.GetField(), Err: errors.New(fv.GetDescription())})
	}
	return fe
}

// NodeNameEnv names the environment variable that gives apply's --node-name
// its default, as the Kubernetes downward API sets it in a pod.
const NodeNameEnv = "NODE_NAME"

// defaultNodeName is NodeNameEnv, else the host name in lower case, which
// is how the kubelet names its node; "" if neither is known.
func defaultNodeName() string {
	if v := os.Getenv(NodeNameEnv); v != "" {
		return v
	}
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(strings.TrimSpace(h))
}
