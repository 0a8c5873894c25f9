// chart-decode strictly decodes rendered Kubernetes manifests against the real API types.
//
//	helm template ... | chart-decode            # or: chart-decode FILE...
//
// Every YAML document must be an object of a kind this program knows (core/v1, apps/v1,
// rbac/v1, policy/v1, scheduling/v1, networking/v1, batch/v1, resource.k8s.io/v1, admissionregistration/v1,
// apiextensions/v1 (CustomResourceDefinition), and the Prometheus
// operator's monitoring.coreos.com/v1). Each one is decoded the way the API server
// decodes a strict request:
//
//   - YAML to JSON with sigs.k8s.io/yaml.YAMLToJSONStrict (duplicate keys fail), then
//   - sigs.k8s.io/json.UnmarshalStrict into the typed object: an unknown field, a field
//     spelled with the wrong case ("ContainerPort") or a duplicate field fails, as do
//     wrong value types and malformed quantities.
//
// On top of the decode it runs a few cheap checks that the API server would also make
// (names, labels, selector vs template labels, port names, probe ports, volume
// references, requests <= limits). It is not a full API-server validation.
//
// Output: one JSON line per object on stdout ({"apiVersion","kind","name","namespace",
// "source"}); on any failure the problems go to stderr and the exit code is 1.
// Exit code 2 means the input could not be read or split into documents.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

type summary struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace,omitempty"`
	Source     string `json:"source,omitempty"`
}

var sourceRE = regexp.MustCompile(`(?m)^# Source: (.+)$`)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, policyv1.AddToScheme,
		schedulingv1.AddToScheme, networkingv1.AddToScheme, batchv1.AddToScheme, resourcev1.AddToScheme,
		monitoringv1.AddToScheme, admissionregistrationv1.AddToScheme, apiextensionsv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

func main() {
	var inputs []io.Reader
	names := []string{}
	if len(os.Args) > 1 {
		for _, p := range os.Args[1:] {
			if p == "-h" || p == "--help" {
				fmt.Println("usage: chart-decode [FILE...]  (reads stdin without FILE)")
				return
			}
			f, err := os.Open(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, "chart-decode:", err)
				os.Exit(2)
			}
			defer f.Close()
			inputs = append(inputs, f)
			names = append(names, p)
		}
	} else {
		inputs = []io.Reader{os.Stdin}
		names = []string{"<stdin>"}
	}

	s := newScheme()
	failures := 0
	objects := 0
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for i, in := range inputs {
		reader := utilyaml.NewYAMLReader(bufio.NewReader(in))
		for doc := 1; ; doc++ {
			raw, err := reader.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: document %d: cannot split YAML: %v\n", names[i], doc, err)
				os.Exit(2)
			}
			src := ""
			if m := sourceRE.FindSubmatch(raw); m != nil {
				src = strings.TrimSpace(string(m[1]))
			}
			where := fmt.Sprintf("%s: document %d", names[i], doc)
			if src != "" {
				where += " (" + src + ")"
			}
			sum, empty, errs := decode(s, raw)
			if empty {
				continue
			}
			objects++
			sum.Source = src
			if len(errs) > 0 {
				failures++
				for _, e := range errs {
					fmt.Fprintf(os.Stderr, "%s %s/%s: %v\n", where, sum.Kind, sum.Name, e)
				}
				continue
			}
			line, _ := json.Marshal(sum)
			out.Write(append(line, '\n'))
		}
	}
	out.Flush()
	if objects == 0 {
		fmt.Fprintln(os.Stderr, "chart-decode: no objects in the input")
		os.Exit(1)
	}
	if failures > 0 {
		fmt.Fprintf(os.Stderr, "chart-decode: %d of %d objects failed\n", failures, objects)
		os.Exit(1)
	}
}

// decode returns the object's summary, whether the document was empty, and its problems.
func decode(s *runtime.Scheme, raw []byte) (summary, bool, []error) {
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return summary{}, false, []error{fmt.Errorf("invalid YAML: %w", err)}
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		return summary{}, true, nil
	}
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return summary{}, false, []error{fmt.Errorf("not a Kubernetes object: %w", err)}
	}
	sum := summary{APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name, Namespace: head.Metadata.Namespace}
	if head.APIVersion == "" || head.Kind == "" {
		return sum, false, []error{errors.New("apiVersion and kind are required")}
	}
	gv, err := schema.ParseGroupVersion(head.APIVersion)
	if err != nil {
		return sum, false, []error{err}
	}
	obj, err := s.New(gv.WithKind(head.Kind))
	if err != nil {
		return sum, false, []error{fmt.Errorf("unknown kind %s in %s (add its types to chart-decode if the chart really needs it)", head.Kind, head.APIVersion)}
	}
	strictErrs, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		return sum, false, []error{err}
	}
	if len(strictErrs) > 0 {
		return sum, false, strictErrs
	}
	return sum, false, check(obj)
}

// ---- light semantic checks -------------------------------------------------------------

func check(obj runtime.Object) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	meta, ok := obj.(metav1.Object)
	if !ok {
		return nil
	}
	for _, m := range validation.IsDNS1123Subdomain(meta.GetName()) {
		add("metadata.name %q: %s", meta.GetName(), m)
	}
	if ns := meta.GetNamespace(); ns != "" {
		for _, m := range validation.IsDNS1123Label(ns) {
			add("metadata.namespace %q: %s", ns, m)
		}
	}
	errs = append(errs, checkLabels("metadata.labels", meta.GetLabels())...)
	errs = append(errs, checkAnnotations("metadata.annotations", meta.GetAnnotations())...)

	switch o := obj.(type) {
	case *appsv1.DaemonSet:
		errs = append(errs, checkSelector("spec.selector", o.Spec.Selector, o.Spec.Template.Labels)...)
		errs = append(errs, checkPodTemplate("spec.template", &o.Spec.Template)...)
		if o.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType && o.Spec.UpdateStrategy.RollingUpdate != nil {
			add("spec.updateStrategy.rollingUpdate: may only be set with type RollingUpdate")
		}
	case *appsv1.Deployment:
		errs = append(errs, checkSelector("spec.selector", o.Spec.Selector, o.Spec.Template.Labels)...)
		errs = append(errs, checkPodTemplate("spec.template", &o.Spec.Template)...)
	case *corev1.Service:
		for _, m := range validation.IsDNS1035Label(o.Name) {
			add("metadata.name %q: %s", o.Name, m)
		}
		if len(o.Spec.Ports) == 0 {
			add("spec.ports: at least one port is required")
		}
		for i, p := range o.Spec.Ports {
			if p.Name != "" {
				for _, m := range validation.IsValidPortName(p.Name) {
					add("spec.ports[%d].name %q: %s", i, p.Name, m)
				}
			}
			if p.TargetPort.Type == intstr.String {
				for _, m := range validation.IsValidPortName(p.TargetPort.StrVal) {
					add("spec.ports[%d].targetPort %q: %s", i, p.TargetPort.StrVal, m)
				}
			}
		}
		errs = append(errs, checkLabels("spec.selector", o.Spec.Selector)...)
	case *corev1.ConfigMap:
		for k := range o.Data {
			for _, m := range validation.IsConfigMapKey(k) {
				add("data key %q: %s", k, m)
			}
		}
	case *monitoringv1.ServiceMonitor:
		if len(o.Spec.Endpoints) == 0 {
			add("spec.endpoints: at least one endpoint is required")
		}
		errs = append(errs, checkSelector("spec.selector", &o.Spec.Selector, nil)...)
	}
	return errs
}

func checkLabels(path string, set map[string]string) []error {
	var errs []error
	for k, v := range set {
		for _, m := range validation.IsQualifiedName(k) {
			errs = append(errs, fmt.Errorf("%s key %q: %s", path, k, m))
		}
		for _, m := range validation.IsValidLabelValue(v) {
			errs = append(errs, fmt.Errorf("%s[%q] value %q: %s", path, k, v, m))
		}
	}
	return errs
}

func checkAnnotations(path string, ann map[string]string) []error {
	var errs []error
	for k := range ann {
		for _, m := range validation.IsQualifiedName(strings.ToLower(k)) {
			errs = append(errs, fmt.Errorf("%s key %q: %s", path, k, m))
		}
	}
	return errs
}

// checkSelector: the selector must be valid and, when template labels are given, match them.
func checkSelector(path string, sel *metav1.LabelSelector, templateLabels map[string]string) []error {
	if sel == nil {
		return []error{fmt.Errorf("%s: required", path)}
	}
	errs := checkLabels(path+".matchLabels", sel.MatchLabels)
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return append(errs, fmt.Errorf("%s: %w", path, err))
	}
	if selector.Empty() {
		errs = append(errs, fmt.Errorf("%s: empty selector", path))
	}
	if templateLabels != nil && !selector.Matches(labels.Set(templateLabels)) {
		errs = append(errs, fmt.Errorf("%s %q does not match the pod template labels %v", path, selector.String(), templateLabels))
	}
	return errs
}

func checkPodTemplate(path string, t *corev1.PodTemplateSpec) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	errs = append(errs, checkLabels(path+".metadata.labels", t.Labels)...)
	errs = append(errs, checkAnnotations(path+".metadata.annotations", t.Annotations)...)
	spec := &t.Spec
	volumes := map[string]bool{}
	for i, v := range spec.Volumes {
		for _, m := range validation.IsDNS1123Label(v.Name) {
			add("%s.spec.volumes[%d].name %q: %s", path, i, v.Name, m)
		}
		if volumes[v.Name] {
			add("%s.spec.volumes[%d].name %q: duplicate", path, i, v.Name)
		}
		volumes[v.Name] = true
		if v.HostPath != nil && !strings.HasPrefix(v.HostPath.Path, "/") {
			add("%s.spec.volumes[%d].hostPath.path %q: must be absolute", path, i, v.HostPath.Path)
		}
	}
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	if len(spec.Containers) == 0 {
		add("%s.spec.containers: at least one container is required", path)
	}
	for _, c := range all {
		cp := fmt.Sprintf("%s.spec.containers[%s]", path, c.Name)
		for _, m := range validation.IsDNS1123Label(c.Name) {
			add("%s.name: %s", cp, m)
		}
		if c.Image == "" {
			add("%s.image: required", cp)
		}
		ports := map[string]int32{}
		for _, p := range c.Ports {
			if p.Name != "" {
				for _, m := range validation.IsValidPortName(p.Name) {
					add("%s.ports %q: %s", cp, p.Name, m)
				}
				ports[p.Name] = p.ContainerPort
			}
			for _, m := range validation.IsValidPortNum(int(p.ContainerPort)) {
				add("%s.ports containerPort %d: %s", cp, p.ContainerPort, m)
			}
		}
		for name, probe := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
			if probe == nil {
				continue
			}
			var port *intstr.IntOrString
			if probe.HTTPGet != nil {
				port = &probe.HTTPGet.Port
			} else if probe.TCPSocket != nil {
				port = &probe.TCPSocket.Port
			}
			if port != nil && port.Type == intstr.String {
				if _, ok := ports[port.StrVal]; !ok {
					add("%s.%s: port %q is not a named port of the container", cp, name, port.StrVal)
				}
			}
		}
		mountPaths := map[string]bool{}
		for _, vm := range c.VolumeMounts {
			if !volumes[vm.Name] {
				add("%s.volumeMounts %q: no volume of that name", cp, vm.Name)
			}
			if mountPaths[vm.MountPath] {
				add("%s.volumeMounts: mountPath %q used twice", cp, vm.MountPath)
			}
			mountPaths[vm.MountPath] = true
		}
		for _, e := range c.Env {
			for _, m := range validation.IsEnvVarName(e.Name) {
				add("%s.env %q: %s", cp, e.Name, m)
			}
		}
		for res, limit := range c.Resources.Limits {
			if req, ok := c.Resources.Requests[res]; ok && req.Cmp(limit) > 0 {
				add("%s.resources: request %s=%s exceeds the limit %s", cp, res, req.String(), limit.String())
			}
		}
		if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged &&
			sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
			add("%s.securityContext: allowPrivilegeEscalation=false cannot be combined with privileged=true", cp)
		}
	}
	return errs
}
