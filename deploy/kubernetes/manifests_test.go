package kubernetes

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// repo is the repository's root, seen from this module.
const repo = "../.."

// tester is what the checks below need of a *testing.T; TestPartitionedCheckFinds runs them
// on a recorder to show they fail on broken manifests.
type tester interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// kustomization is the part of a kustomization.yaml these manifests use; strict decoding
// refuses anything else.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// objects is what one variant's resources decode to, by kind.
type objects struct {
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	services     []*corev1.Service
	pdbs         []*policyv1.PodDisruptionBudget
	netpols      []*networkingv1.NetworkPolicy
	image        string // the kustomization's image name
}

// load decodes a variant: its kustomization.yaml, whose resources must be exactly the
// directory's manifests (nats-values.yaml is Helm's, not a manifest), and every document of
// every resource, strictly (an unknown or misspelt field, a duplicate key or a value of the
// wrong type is an error) into the typed Kubernetes API structs of its kind.
func load(t tester, dir string) objects {
	t.Helper()
	var k kustomization
	decodeStrict(t, filepath.Join(dir, "kustomization.yaml"), readFile(t, filepath.Join(dir, "kustomization.yaml")), &k)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" || len(k.Images) != 1 || k.Images[0].Name == "" {
		t.Fatalf("%s/kustomization.yaml: %+v", dir, k)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	var manifests []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && b != "nats-values.yaml" {
			manifests = append(manifests, b)
		}
	}
	if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, manifests) {
		t.Errorf("%s/kustomization.yaml lists %v, the directory holds %v", dir, got, manifests)
	}
	o := objects{image: k.Images[0].Name}
	for _, name := range k.Resources {
		path := filepath.Join(dir, name)
		for i, doc := range bytes.Split(readFile(t, path), []byte("\n---\n")) {
			where := fmt.Sprintf("%s document %d", path, i+1)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 StatefulSet":
				o.statefulSets = append(o.statefulSets, decodeStrict(t, where, doc, &appsv1.StatefulSet{}))
			case "apps/v1 Deployment":
				o.deployments = append(o.deployments, decodeStrict(t, where, doc, &appsv1.Deployment{}))
			case "v1 Service":
				o.services = append(o.services, decodeStrict(t, where, doc, &corev1.Service{}))
			case "policy/v1 PodDisruptionBudget":
				o.pdbs = append(o.pdbs, decodeStrict(t, where, doc, &policyv1.PodDisruptionBudget{}))
			case "networking.k8s.io/v1 NetworkPolicy":
				o.netpols = append(o.netpols, decodeStrict(t, where, doc, &networkingv1.NetworkPolicy{}))
			default:
				t.Fatalf("%s: unexpected %s %s (add its type to this test)", where, tm.APIVersion, tm.Kind)
			}
		}
	}
	return o
}

func readFile(t tester, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return data
}

func decodeStrict[T any](t tester, where string, doc []byte, v T) T {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return v
}

// TestDecodeStrictRefusesMistakes: the decoding the other tests rely on fails on the
// mistakes it is meant to catch, so a clean decode means something.
func TestDecodeStrictRefusesMistakes(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
	}{
		{"misspelt field", "apiVersion: v1\nkind: Service\nspec:\n  selectr: {a: b}\n"},
		{"field at the wrong level", "apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replicas: 3\n  image: x\n"},
		{"wrong type", "apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replicas: three\n"},
		{"bad quantity", "apiVersion: v1\nkind: PersistentVolumeClaim\nspec:\n  resources:\n    requests:\n      storage: ten-gigs\n"},
		{"duplicate key", "apiVersion: v1\nkind: Service\nspec:\n  clusterIP: None\n  clusterIP: 10.0.0.1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs = []any{&corev1.Service{}, &appsv1.StatefulSet{}, &corev1.PersistentVolumeClaim{}}
			for _, v := range objs {
				if err := yaml.UnmarshalStrict([]byte(tc.doc), v); err == nil && strings.Contains(tc.doc, kindOf(v)) {
					t.Errorf("%T decoded %q without an error", v, tc.doc)
				}
			}
		})
	}
}

func kindOf(v any) string {
	s := fmt.Sprintf("%T", v)
	return "kind: " + s[strings.LastIndex(s, ".")+1:]
}

// serveFlags are the flags `oncegate serve` defines, read from the golden file of its -h
// output, which cmd/oncegate's tests keep equal to what the binary prints.
func serveFlags(t tester) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(string(readFile(t, filepath.Join(repo, "cmd/oncegate/testdata/serve-help.txt"))), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 {
		t.Fatalf("only %d flags in serve-help.txt", len(flags))
	}
	return flags
}

// args parses a container's args: the subcommand, then --name=value flags (the manifests
// write every flag that way).
func args(t tester, c corev1.Container, known map[string]bool) map[string]string {
	t.Helper()
	if len(c.Args) == 0 || c.Args[0] != "serve" || len(c.Command) != 0 {
		t.Fatalf("container %s: command %q args %q, want the image's entrypoint with args serve …", c.Name, c.Command, c.Args)
	}
	out := map[string]string{}
	for _, a := range c.Args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Errorf("container %s: argument %q is not --name=value", c.Name, a)
			continue
		}
		if !known[name] {
			t.Errorf("container %s: oncegate serve has no flag --%s", c.Name, name)
		}
		out[name] = value
	}
	return out
}

// env is a container's literal environment; a variable from a Secret maps to "secret:NAME/KEY".
func env(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			out[e.Name] = "resource:" + e.ValueFrom.ResourceFieldRef.Resource
		default:
			out[e.Name] = e.Value
		}
	}
	return out
}

// envNames are the ONCEGATE_* and OPENAI_* variables the gateway reads (internal/config).
func envNames(t tester) map[string]bool {
	t.Helper()
	names := map[string]bool{"GOMEMLIMIT": true}
	for _, m := range regexp.MustCompile(`"((?:ONCEGATE|OPENAI)_[A-Z_]+)"`).FindAllStringSubmatch(string(readFile(t, filepath.Join(repo, "internal/config/env.go"))), -1) {
		names[m[1]] = true
	}
	return names
}

// httpRoutes are the GET paths the gateway serves without /v1: httpapi's and the metrics
// listener's, read from their sources.
func httpRoutes(t tester) map[string]string {
	t.Helper()
	routes := map[string]string{}
	for _, m := range regexp.MustCompile(`s\.app\.Get\("(/[a-z]+)"`).FindAllStringSubmatch(string(readFile(t, filepath.Join(repo, "httpapi/server.go"))), -1) {
		routes[m[1]] = "http"
	}
	if strings.Contains(string(readFile(t, filepath.Join(repo, "gateway/metrics.go"))), `mux.Handle("GET /metrics"`) {
		routes["/metrics@metrics"] = "metrics"
	}
	for _, want := range []string{"/healthz", "/readyz", "/metrics@metrics"} {
		if routes[want] == "" {
			t.Fatalf("the gateway's sources no longer serve %s: %v", want, routes)
		}
	}
	return routes
}

// checkPod checks what every oncegate pod template keeps: one container running the
// kustomization's image as the image's user (65532, non-root, no privilege escalation),
// flags oncegate has, variables it reads, OPENAI_BASE_URL and OPENAI_API_KEY from one Secret
// (both or neither), and probes that GET a route the gateway serves on a named port the
// container declares.
func checkPod(t tester, where string, tpl corev1.PodTemplateSpec, image string, flags map[string]bool) (corev1.Container, map[string]string, map[string]string) {
	t.Helper()
	spec := tpl.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != image {
		t.Errorf("%s: image %q, want %q (the kustomization's images[].name)", where, c.Image, image)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("%s: pod securityContext %+v, want runAsNonRoot and runAsUser 65532 (the Dockerfile's USER)", where, spec.SecurityContext)
	}
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container securityContext %+v, want allowPrivilegeEscalation: false", where, c.SecurityContext)
	}
	a := args(t, c, flags)
	e := env(c)
	known := envNames(t)
	for name := range e {
		if !known[name] {
			t.Errorf("%s: the gateway reads no variable %s", where, name)
		}
	}
	if e["OPENAI_BASE_URL"] != "secret:oncegate-openai/base_url" || e["OPENAI_API_KEY"] != "secret:oncegate-openai/api_key" {
		t.Errorf("%s: OPENAI_BASE_URL %q, OPENAI_API_KEY %q, want both from the Secret oncegate-openai", where, e["OPENAI_BASE_URL"], e["OPENAI_API_KEY"])
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	routes := httpRoutes(t)
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
	}{{"startup", c.StartupProbe}, {"liveness", c.LivenessProbe}, {"readiness", c.ReadinessProbe}} {
		if p.probe == nil {
			continue
		}
		g := p.probe.HTTPGet
		if g == nil {
			t.Errorf("%s: %s probe is not an httpGet", where, p.name)
			continue
		}
		path := g.Path
		if g.Port.StrVal == "metrics" {
			path += "@metrics"
		}
		if routes[path] != g.Port.StrVal || ports[g.Port.StrVal] == 0 {
			t.Errorf("%s: %s probe GETs %s on port %q: not a route the gateway serves there, or no such container port (%v)", where, p.name, g.Path, g.Port.String(), ports)
		}
	}
	if c.LivenessProbe == nil || c.StartupProbe == nil {
		t.Errorf("%s: needs a startup and a liveness probe", where)
	}
	return c, a, e
}

// portOf is the port of a host:port, or "" when it has none.
func portOf(hostport string) string {
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return ""
	}
	return port
}

// checkSelects fails unless selector matches the pod labels.
func checkSelects(t tester, where string, selector *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: selector %v (%v) does not select the pods %v", where, selector, err, podLabels)
	}
}

// checkService fails unless svc selects the pods and each target port is a named port of c.
func checkService(t tester, svc *corev1.Service, podLabels map[string]string, c corev1.Container) {
	t.Helper()
	checkSelects(t, "Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, podLabels)
	for _, p := range svc.Spec.Ports {
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
			return cp.Name == p.TargetPort.StrVal && cp.ContainerPort == p.Port
		}) {
			t.Errorf("Service %s: port %d → %q is not a named container port with that number (%v)", svc.Name, p.Port, p.TargetPort.String(), c.Ports)
		}
	}
}

// TestEmbeddedCluster: deploy/kubernetes/embedded is a StatefulSet of three nodes whose
// embedded NATS servers form one cluster (checkNode: started in parallel, routes naming
// exactly the three pods under the headless Service, R3, probes, the store on a claim), a
// client Service on the HTTP port, a PodDisruptionBudget that keeps a majority, and a
// NetworkPolicy that opens the unauthenticated route port to the nodes only.
func TestEmbeddedCluster(t *testing.T) {
	o := load(t, "embedded")
	if len(o.statefulSets) != 1 || len(o.services) != 2 || len(o.pdbs) != 1 || len(o.netpols) != 1 || len(o.deployments) != 0 {
		t.Fatalf("want 1 StatefulSet, 2 Services, 1 PDB, 1 NetworkPolicy; got %d, %d, %d, %d (and %d Deployments)",
			len(o.statefulSets), len(o.services), len(o.pdbs), len(o.netpols), len(o.deployments))
	}
	sts := o.statefulSets[0]
	c, _ := checkNode(t, sts, o.statefulSets, o.services, o.image, serveFlags(t))
	podLabels := sts.Spec.Template.Labels
	client := clientServices(o)
	if len(client) != 1 {
		t.Fatalf("want one client Service besides the headless one, got %d", len(client))
	}
	checkService(t, client[0], podLabels, c)

	pdb := o.pdbs[0]
	checkSelects(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector, podLabels)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != int(replicasOf(sts))/2+1 {
		t.Errorf("PodDisruptionBudget %s: minAvailable %v, want a majority of %d", pdb.Name, pdb.Spec.MinAvailable, replicasOf(sts))
	}
	checkRoutePolicy(t, o.netpols[0], podLabels)
}

// replicasOf is a StatefulSet's replica count, 0 when unset.
func replicasOf(sts *appsv1.StatefulSet) int32 {
	if sts.Spec.Replicas == nil {
		return 0
	}
	return *sts.Spec.Replicas
}

// clientServices are a variant's Services that are no StatefulSet's governing (headless) one.
func clientServices(o objects) []*corev1.Service {
	var out []*corev1.Service
	for _, s := range o.services {
		if !slices.ContainsFunc(o.statefulSets, func(sts *appsv1.StatefulSet) bool { return sts.Spec.ServiceName == s.Name }) {
			out = append(out, s)
		}
	}
	return out
}

// checkNode checks a StatefulSet of embedded cluster nodes: three replicas started in
// parallel (a node is ready only with a majority), a selector on its pods, the pod
// (checkPod), routes naming exactly the pods of every StatefulSet of the cluster (members)
// by their stable names under their headless Service (which publishes not-ready pods), on
// the route port the node listens on, R3, HTTP on the container's port 8080, readiness on
// /readyz, startup and liveness on /healthz, the store on a claim at /data that the image's
// user can write. It returns the container and its flags.
func checkNode(t tester, sts *appsv1.StatefulSet, members []*appsv1.StatefulSet, services []*corev1.Service, image string, flags map[string]bool) (corev1.Container, map[string]string) {
	t.Helper()
	where := "StatefulSet " + sts.Name
	if replicasOf(sts) != 3 {
		t.Errorf("%s: replicas %d, want 3", where, replicasOf(sts))
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("%s: podManagementPolicy %q, want Parallel", where, sts.Spec.PodManagementPolicy)
	}
	podLabels := sts.Spec.Template.Labels
	checkSelects(t, where, sts.Spec.Selector, podLabels)
	c, a, e := checkPod(t, where, sts.Spec.Template, image, flags)

	i := slices.IndexFunc(services, func(s *corev1.Service) bool { return s.Name == sts.Spec.ServiceName })
	if i < 0 || services[i].Spec.ClusterIP != corev1.ClusterIPNone || !services[i].Spec.PublishNotReadyAddresses {
		t.Fatalf("%s: serviceName %q is not a headless Service that publishes not-ready pods", where, sts.Spec.ServiceName)
	}
	headless := services[i]
	checkService(t, headless, podLabels, c)

	routePort := portOf(a["nats-cluster-listen"])
	var want []string
	for _, m := range members {
		for i := range replicasOf(m) {
			want = append(want, fmt.Sprintf("nats://%s-%d.%s:%s", m.Name, i, m.Spec.ServiceName, routePort))
		}
	}
	got := strings.Split(a["nats-routes"], ",")
	if a["nats-cluster"] == "" || routePort == "" || !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("%s: --nats-cluster %q --nats-cluster-listen %q --nats-routes %q, want a cluster name and the routes %q",
			where, a["nats-cluster"], a["nats-cluster-listen"], a["nats-routes"], want)
	}
	if a["nats-replicas"] != "3" {
		t.Errorf("%s: --nats-replicas %q, want 3", where, a["nats-replicas"])
	}
	if len(headless.Spec.Ports) != 1 || headless.Spec.Ports[0].Name != "routes" || fmt.Sprint(headless.Spec.Ports[0].Port) != routePort {
		t.Errorf("Service %s: ports %v, want the route port %s", headless.Name, headless.Spec.Ports, routePort)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == 8080 }) ||
		portOf(e["ONCEGATE_LISTEN"]) != "8080" {
		t.Errorf("%s: ONCEGATE_LISTEN %q, want port 8080, the container's http port", where, e["ONCEGATE_LISTEN"])
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: readiness on %v, liveness on %v; want /readyz and /healthz", where, c.ReadinessProbe, c.LivenessProbe)
	}
	// A node restoring its store after a crash answers 200 on /healthz only (issue 43): a
	// probe that restarts the container on another route would end a restore that begins
	// again at every start.
	if c.StartupProbe == nil || c.StartupProbe.HTTPGet == nil || c.StartupProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: startup probe on %s, want /healthz, the route a node restoring its store answers 200", where, c.StartupProbe)
	}

	if e["ONCEGATE_DATA_DIR"] != "/data" || len(sts.Spec.VolumeClaimTemplates) != 1 ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == sts.Spec.VolumeClaimTemplates[0].Name && m.MountPath == "/data"
		}) {
		t.Errorf("%s: ONCEGATE_DATA_DIR %q, claims %d, mounts %v; want the claim mounted at /data, the data dir",
			where, e["ONCEGATE_DATA_DIR"], len(sts.Spec.VolumeClaimTemplates), c.VolumeMounts)
	}
	if sc := sts.Spec.Template.Spec.SecurityContext; sc == nil || sc.FSGroup == nil || *sc.FSGroup != 65532 {
		t.Errorf("%s: pod securityContext %v, want fsGroup 65532 so the claim is writable by the image's user", where, sc)
	}
	return c, a
}

// checkRoutePolicy fails unless np applies to every node (pods: each StatefulSet's pod
// labels) and opens the unauthenticated route port to those nodes only.
func checkRoutePolicy(t tester, np *networkingv1.NetworkPolicy, pods ...map[string]string) {
	t.Helper()
	where := "NetworkPolicy " + np.Name
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port.StrVal == "routes" && (len(rule.From) != 1 || rule.From[0].PodSelector == nil) {
				t.Errorf("%s: the route port is open to %v, want the nodes only", where, rule.From)
			}
		}
	}
	i := slices.IndexFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return len(r.From) == 1 && r.From[0].PodSelector != nil && slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.StrVal == "routes" })
	})
	if i < 0 {
		t.Fatalf("%s: no rule lets the nodes reach each other's route port", where)
	}
	for _, podLabels := range pods {
		checkSelects(t, where, &np.Spec.PodSelector, podLabels)
		checkSelects(t, where+" route rule's from", np.Spec.Ingress[i].From[0].PodSelector, podLabels)
	}
}

// TestEmbeddedPartitioned: deploy/kubernetes/embedded-partitioned (checkPartitioned).
func TestEmbeddedPartitioned(t *testing.T) {
	checkPartitioned(t, load(t, "embedded-partitioned"), serveFlags(t))
}

// tagRE is a partition's placement tag (partition.P.Tag) in a --nats-tags value.
var tagRE = regexp.MustCompile(`^og-p([0-9]+)$`)

// checkPartitioned checks the partitioned variant: one embedded cluster of StatefulSets, one
// per partition, each checked as the embedded variant's nodes are (checkNode: three
// replicas, R3, the routes of all the sets' pods on every node, probes, claim); every node
// has the same --nats-partitions, the number of sets, and --nats-place-partitions; set
// oncegate-p<k> is tagged og-p<k> alone (each partition's streams on its own three nodes);
// a set's selector selects no other set's pods; one PodDisruptionBudget per set that
// selects exactly that set's pods with maxUnavailable 1 (a partition keeps its quorum); one
// client Service and the route NetworkPolicy over every set.
func checkPartitioned(t tester, o objects, flags map[string]bool) {
	t.Helper()
	parts := len(o.statefulSets)
	if parts < 2 || len(o.services) != 2 || len(o.pdbs) != parts || len(o.netpols) != 1 || len(o.deployments) != 0 {
		t.Fatalf("want 2 or more StatefulSets (one per partition), 2 Services, a PDB per StatefulSet, 1 NetworkPolicy; got %d, %d, %d, %d (and %d Deployments)",
			parts, len(o.services), len(o.pdbs), len(o.netpols), len(o.deployments))
	}
	client := clientServices(o)
	if len(client) != 1 {
		t.Fatalf("want one client Service besides the headless one, got %d", len(client))
	}
	var pods []map[string]string
	for _, sts := range o.statefulSets {
		pods = append(pods, sts.Spec.Template.Labels)
	}
	tagged := map[string]string{}
	first := map[string]string{}
	for i, sts := range o.statefulSets {
		where := "StatefulSet " + sts.Name
		c, a := checkNode(t, sts, o.statefulSets, o.services, o.image, flags)
		if i == 0 {
			first = a
		}
		for _, f := range []string{"nats-partitions", "nats-cluster", "nats-cluster-listen"} {
			if a[f] != first[f] {
				t.Errorf("%s: --%s %q, but %s has %q: the same on every node", where, f, a[f], o.statefulSets[0].Name, first[f])
			}
		}
		if a["nats-partitions"] != fmt.Sprint(parts) {
			t.Errorf("%s: --nats-partitions %q, want %d, one partition per StatefulSet", where, a["nats-partitions"], parts)
		}
		if a["nats-place-partitions"] != "true" {
			t.Errorf("%s: --nats-place-partitions %q, want true (each partition's streams on its own nodes)", where, a["nats-place-partitions"])
		}
		m := tagRE.FindStringSubmatch(a["nats-tags"])
		switch {
		case m == nil || sts.Name != "oncegate-p"+m[1]:
			t.Errorf("%s: --nats-tags %q, want og-p<k> alone, k the partition its name ends in", where, a["nats-tags"])
		case tagged[m[0]] != "":
			t.Errorf("%s: --nats-tags %q, the tag of %s too", where, a["nats-tags"], tagged[m[0]])
		default:
			tagged[m[0]] = sts.Name
		}
		checkService(t, client[0], sts.Spec.Template.Labels, c)

		sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
		if err != nil {
			t.Fatalf("%s: selector %v: %v", where, sts.Spec.Selector, err)
		}
		budgets := 0
		for j, other := range o.statefulSets {
			if j != i && sel.Matches(labels.Set(other.Spec.Template.Labels)) {
				t.Errorf("%s: its selector %v also selects %s's pods", where, sts.Spec.Selector, other.Name)
			}
		}
		for _, pdb := range o.pdbs {
			ps, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || ps.Empty() || !ps.Matches(labels.Set(sts.Spec.Template.Labels)) {
				continue
			}
			budgets++
			for j, other := range o.statefulSets {
				if j != i && ps.Matches(labels.Set(other.Spec.Template.Labels)) {
					t.Errorf("PodDisruptionBudget %s selects the pods of %s and of %s: a drain could take two nodes of one partition", pdb.Name, sts.Name, other.Name)
				}
			}
			if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" {
				t.Errorf("PodDisruptionBudget %s: minAvailable %v, maxUnavailable %v; want maxUnavailable 1 alone (a partition keeps its quorum)", pdb.Name, pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
			}
		}
		if budgets != 1 {
			t.Errorf("%s: %d PodDisruptionBudgets select its pods, want 1", where, budgets)
		}
	}
	checkRoutePolicy(t, o.netpols[0], pods...)
}

// recorder is a tester that keeps the errors; its Fatalf stops the check with a panic that
// run recovers.
type recorder struct{ errs []string }

type fatal struct{}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(fatal{})
}

// run runs check on r, stopping where a Fatalf stops it.
func (r *recorder) run(check func(tester)) {
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(fatal); !ok {
				panic(p)
			}
		}
	}()
	check(r)
}

// clone is a deep copy of o, to break.
func (o objects) clone() objects {
	c := objects{image: o.image}
	for _, s := range o.statefulSets {
		c.statefulSets = append(c.statefulSets, s.DeepCopy())
	}
	for _, d := range o.deployments {
		c.deployments = append(c.deployments, d.DeepCopy())
	}
	for _, s := range o.services {
		c.services = append(c.services, s.DeepCopy())
	}
	for _, p := range o.pdbs {
		c.pdbs = append(c.pdbs, p.DeepCopy())
	}
	for _, n := range o.netpols {
		c.netpols = append(c.netpols, n.DeepCopy())
	}
	return c
}

// setArg sets the flag --name of a StatefulSet's container to value, or drops it when value
// is "".
func setArg(sts *appsv1.StatefulSet, name, value string) {
	c := &sts.Spec.Template.Spec.Containers[0]
	c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--"+name+"=") })
	if value != "" {
		c.Args = append(c.Args, "--"+name+"="+value)
	}
}

// argOf is the value of a StatefulSet's flag --name.
func argOf(sts *appsv1.StatefulSet, name string) string {
	for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestPartitionedCheckFinds: checkPartitioned passes the shipped manifests and fails each
// one broken in a way that matters, with the message that names the mistake.
func TestPartitionedCheckFinds(t *testing.T) {
	shipped := load(t, "embedded-partitioned")
	flags := serveFlags(t)
	instance := "app.kubernetes.io/instance"
	for _, tc := range []struct {
		name   string
		mutate func(o *objects)
		want   string // in one of the errors; "" for none
	}{
		{"as shipped", func(*objects) {}, ""},
		{"both sets tagged og-p0", func(o *objects) { setArg(o.statefulSets[1], "nats-tags", "og-p0") }, "want og-p<k> alone"},
		{"tags swapped", func(o *objects) {
			setArg(o.statefulSets[0], "nats-tags", "og-p1")
			setArg(o.statefulSets[1], "nats-tags", "og-p0")
		}, "want og-p<k> alone"},
		{"a second tag", func(o *objects) { setArg(o.statefulSets[0], "nats-tags", "og-p0,fast") }, "want og-p<k> alone"},
		{"partition counts differ", func(o *objects) { setArg(o.statefulSets[1], "nats-partitions", "3") }, "the same on every node"},
		{"one partition", func(o *objects) {
			for _, s := range o.statefulSets {
				setArg(s, "nats-partitions", "1")
			}
		}, "one partition per StatefulSet"},
		{"placement off", func(o *objects) { setArg(o.statefulSets[0], "nats-place-partitions", "") }, "--nats-place-partitions"},
		{"a route missing", func(o *objects) {
			r := strings.Split(argOf(o.statefulSets[0], "nats-routes"), ",")
			setArg(o.statefulSets[0], "nats-routes", strings.Join(r[:len(r)-1], ","))
		}, "want a cluster name and the routes"},
		{"only its own set's routes", func(o *objects) {
			r := strings.Split(argOf(o.statefulSets[1], "nats-routes"), ",")
			setArg(o.statefulSets[1], "nats-routes", strings.Join(r[3:], ","))
		}, "want a cluster name and the routes"},
		{"a pod named twice", func(o *objects) {
			r := strings.Split(argOf(o.statefulSets[0], "nats-routes"), ",")
			r[5] = r[4]
			setArg(o.statefulSets[0], "nats-routes", strings.Join(r, ","))
		}, "want a cluster name and the routes"},
		{"R1", func(o *objects) { setArg(o.statefulSets[1], "nats-replicas", "1") }, "--nats-replicas"},
		{"four nodes in a set", func(o *objects) { *o.statefulSets[1].Spec.Replicas = 4 }, "replicas 4, want 3"},
		{"other cluster name", func(o *objects) { setArg(o.statefulSets[1], "nats-cluster", "other") }, "the same on every node"},
		{"a set's selector selects both", func(o *objects) {
			delete(o.statefulSets[0].Spec.Selector.MatchLabels, instance)
		}, "also selects"},
		{"a budget over both sets", func(o *objects) { delete(o.pdbs[0].Spec.Selector.MatchLabels, instance) }, "a drain could take two nodes"},
		{"a budget selects the wrong set", func(o *objects) {
			o.pdbs[0].Spec.Selector.MatchLabels[instance] = o.pdbs[1].Spec.Selector.MatchLabels[instance]
		}, "PodDisruptionBudgets select its pods, want 1"},
		{"minAvailable 2", func(o *objects) {
			two := intstr.FromInt32(2)
			o.pdbs[1].Spec.MaxUnavailable, o.pdbs[1].Spec.MinAvailable = nil, &two
		}, "want maxUnavailable 1 alone"},
		{"maxUnavailable 2", func(o *objects) {
			two := intstr.FromInt32(2)
			o.pdbs[1].Spec.MaxUnavailable = &two
		}, "want maxUnavailable 1 alone"},
		{"client Service on one set", func(o *objects) {
			for _, s := range o.services {
				if s.Spec.ClusterIP != corev1.ClusterIPNone {
					s.Spec.Selector[instance] = "oncegate-p0"
				}
			}
		}, "does not select the pods"},
		{"headless Service on one set", func(o *objects) {
			for _, s := range o.services {
				if s.Spec.ClusterIP == corev1.ClusterIPNone {
					s.Spec.Selector[instance] = "oncegate-p1"
				}
			}
		}, "does not select the pods"},
		{"network policy on one set", func(o *objects) { o.netpols[0].Spec.PodSelector.MatchLabels[instance] = "oncegate-p0" }, "does not select the pods"},
		{"routes open to one set", func(o *objects) {
			o.netpols[0].Spec.Ingress[0].From[0].PodSelector.MatchLabels[instance] = "oncegate-p1"
		}, "route rule's from"},
		{"readiness on /healthz", func(o *objects) {
			o.statefulSets[1].Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Path = "/healthz"
		}, "want /readyz and /healthz"},
		{"no claim", func(o *objects) { o.statefulSets[0].Spec.VolumeClaimTemplates = nil }, "want the claim mounted at /data"},
		{"a third set", func(o *objects) {
			p2 := o.statefulSets[1].DeepCopy()
			p2.Name = "oncegate-p2"
			o.statefulSets = append(o.statefulSets, p2)
		}, "a PDB per StatefulSet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := shipped.clone()
			tc.mutate(&o)
			var r recorder
			r.run(func(t tester) { checkPartitioned(t, o, flags) })
			switch {
			case tc.want == "" && len(r.errs) > 0:
				t.Errorf("the shipped manifests fail: %q", r.errs)
			case tc.want != "" && !slices.ContainsFunc(r.errs, func(e string) bool { return strings.Contains(e, tc.want) }):
				t.Errorf("no error says %q; got %q", tc.want, r.errs)
			}
		})
	}
}

// natsValues is the part of the NATS chart's values nats-values.yaml sets.
type natsValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				PVC struct {
					Size string `json:"size"`
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct {
				Enabled bool   `json:"enabled"`
				MaxSize string `json:"maxSize"`
			} `json:"memoryStore"`
		} `json:"jetstream"`
	} `json:"config"`
}

// TestExternalNATS: deploy/kubernetes/external-nats runs the api and worker roles as two
// Deployments on a NATS cluster from the official chart: the chart's values make a
// JetStream cluster of three, every process lists the three servers by the chart's pod
// names, streams are R3, the api role is behind the client Service with readiness on
// /readyz, the worker role serves no API and is probed on its metrics port, and each has a
// PodDisruptionBudget that selects its own pods only.
func TestExternalNATS(t *testing.T) {
	var v natsValues
	decodeStrict(t, "nats-values.yaml", readFile(t, "external-nats/nats-values.yaml"), &v)
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 || !v.Config.JetStream.Enabled || !v.Config.JetStream.MemoryStore.Enabled {
		t.Errorf("nats-values.yaml: %+v, want a JetStream cluster of 3 with a memory store", v.Config)
	}
	var servers []string
	for i := range v.Config.Cluster.Replicas {
		servers = append(servers, fmt.Sprintf("nats://nats-%d.nats-headless:4222", i))
	}

	o := load(t, "external-nats")
	if len(o.deployments) != 2 || len(o.services) != 1 || len(o.pdbs) != 2 || len(o.statefulSets) != 0 {
		t.Fatalf("want 2 Deployments, 1 Service, 2 PDBs; got %d, %d, %d (and %d StatefulSets)", len(o.deployments), len(o.services), len(o.pdbs), len(o.statefulSets))
	}
	flags := serveFlags(t)
	roles := map[string]*appsv1.Deployment{}
	for _, d := range o.deployments {
		where := "Deployment " + d.Name
		checkSelects(t, where, d.Spec.Selector, d.Spec.Template.Labels)
		c, a, e := checkPod(t, where, d.Spec.Template, o.image, flags)
		roles[a["role"]] = d
		if got := strings.Split(e["ONCEGATE_NATS_URL"], ","); !slices.Equal(got, servers) {
			t.Errorf("%s: ONCEGATE_NATS_URL %q, want %q", where, e["ONCEGATE_NATS_URL"], servers)
		}
		if a["nats-replicas"] != "3" {
			t.Errorf("%s: --nats-replicas %q, want 3", where, a["nats-replicas"])
		}
		for _, p := range o.pdbs {
			sel, _ := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) != (p.Name == d.Name) {
				t.Errorf("PodDisruptionBudget %s selects %s's pods: %v", p.Name, d.Name, sel.Matches(labels.Set(d.Spec.Template.Labels)))
			}
		}
		switch a["role"] {
		case "api":
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || portOf(e["ONCEGATE_LISTEN"]) != "8080" {
				t.Errorf("%s: readiness %v, ONCEGATE_LISTEN %q; want /readyz and port 8080", where, c.ReadinessProbe, e["ONCEGATE_LISTEN"])
			}
			checkService(t, o.services[0], d.Spec.Template.Labels, c)
			// Its cold tier's index is written to the data dir (the image's /data), which a
			// read-only root filesystem does not hold: a volume must be mounted there.
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/data" }) {
				t.Errorf("%s: nothing mounted at /data, where an api node writes its cold tier's index (root filesystem read-only: %v)",
					where, c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem)
			}
		case "worker":
			if c.ReadinessProbe != nil || e["ONCEGATE_LISTEN"] != "" || portOf(a["metrics-listen"]) != "9464" {
				t.Errorf("%s: a worker serves no API: readiness %v, ONCEGATE_LISTEN %q; --metrics-listen %q", where, c.ReadinessProbe, e["ONCEGATE_LISTEN"], a["metrics-listen"])
			}
		}
	}
	if roles["api"] == nil || roles["worker"] == nil || len(roles) != 2 {
		t.Fatalf("want one Deployment with --role=api and one with --role=worker, got %v", roles)
	}
	if sel := labels.SelectorFromSet(o.services[0].Spec.Selector); sel.Matches(labels.Set(roles["worker"].Spec.Template.Labels)) {
		t.Errorf("Service %s sends HTTP to the workers too", o.services[0].Name)
	}
}
