// slice-validate checks ResourceSlices the way a Kubernetes 1.37 API server does on create, and the
// status.devices entries a driver writes into a ResourceClaim the way it does on a status update.
//
//	slice-validate [-feature-gates=Name=bool,...] [FILE...]   (reads stdin without FILE)
//
// Input: YAML or JSON documents, each a resource.k8s.io/v1 ResourceSlice. Each one is
//
//   - decoded strictly like a request body: YAML to JSON with sigs.k8s.io/yaml.YAMLToJSONStrict
//     (duplicate keys fail), then sigs.k8s.io/json.UnmarshalStrict into k8s.io/api/resource/v1
//     types (unknown or wrongly cased fields, wrong value types, bad quantities fail);
//   - defaulted and converted to the internal type through the API server's own scheme
//     (k8s.io/kubernetes/pkg/apis/resource/install);
//   - run through the API server's create path for ResourceSlices: rest.BeforeCreate with the
//     registry's resourceslice.Strategy, which drops fields of disabled feature gates
//     (PrepareForCreate) and runs the hand-written validation (pkg/apis/resource/validation)
//     and the declarative validation of the v1 types.
//
// A document of kind ResourceClaim is the claim as it is after the driver's write (claimstatus.go):
// the update is checked against the same claim without status.devices, through the registry's
// status strategy (rest.BeforeUpdate with resourceclaim's StatusStrategy), as the driver's service
// account bound to the claim's node; the authorization checks the strategy asks for are printed.
//
// Feature gates are the 1.37 defaults unless -feature-gates says otherwise (e.g.
// DRADeviceTaints=false shows what an API server with that gate off keeps of a slice).
//
// Output: one JSON line per valid slice on stdout ({"name","driver","pool","devices","taints"},
// taints counted after PrepareForCreate); problems on stderr and exit code 1. Exit code 2:
// the input could not be read or a flag is wrong.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	_ "k8s.io/kubernetes/pkg/features" // registers the kube feature gates and their 1.37 defaults
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

type summary struct {
	Name    string `json:"name"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Devices int    `json:"devices"`
	Taints  int    `json:"taints"`
}

func main() {
	gates := flag.String("feature-gates", "", "feature gates to change, e.g. DRADeviceTaints=false")
	flag.Parse()
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			fmt.Fprintln(os.Stderr, "slice-validate: -feature-gates:", err)
			os.Exit(2)
		}
	}
	var inputs []io.Reader
	names := flag.Args()
	for _, p := range names {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "slice-validate:", err)
			os.Exit(2)
		}
		defer f.Close()
		inputs = append(inputs, f)
	}
	if len(inputs) == 0 {
		inputs, names = []io.Reader{os.Stdin}, []string{"<stdin>"}
	}

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	objects, failures := 0, 0
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
			line, name, empty, errs := check(raw)
			if empty {
				continue
			}
			objects++
			if len(errs) > 0 {
				failures++
				for _, e := range errs {
					fmt.Fprintf(os.Stderr, "%s: document %d %s: %v\n", names[i], doc, name, e)
				}
				continue
			}
			out.Write(append(line, '\n'))
		}
	}
	out.Flush()
	if objects == 0 {
		fmt.Fprintln(os.Stderr, "slice-validate: no objects in the input")
		os.Exit(1)
	}
	if failures > 0 {
		fmt.Fprintf(os.Stderr, "slice-validate: %d of %d objects failed\n", failures, objects)
		os.Exit(1)
	}
}

// check decodes one document strictly and runs the API server's path for its kind: the output line, the
// object's name for messages, whether the document was empty, the problems.
func check(raw []byte) ([]byte, string, bool, []error) {
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return nil, "", false, []error{fmt.Errorf("invalid YAML: %w", err)}
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		return nil, "", true, nil
	}
	var head metav1.TypeMeta
	if err := json.Unmarshal(js, &head); err != nil {
		return nil, "", false, []error{fmt.Errorf("not a Kubernetes object: %w", err)}
	}
	if head.APIVersion == resourcev1.SchemeGroupVersion.String() && head.Kind == "ResourceClaim" {
		return checkClaimStatus(js)
	}
	sum, empty, errs := checkSlice(raw)
	line, _ := json.Marshal(sum)
	return line, fmt.Sprintf("ResourceSlice %q", sum.Name), empty, errs
}

// checkSlice decodes one ResourceSlice strictly and runs the API server's create path on it.
func checkSlice(raw []byte) (summary, bool, []error) {
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return summary{}, false, []error{fmt.Errorf("invalid YAML: %w", err)}
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		return summary{}, true, nil
	}
	var head metav1.TypeMeta
	if err := json.Unmarshal(js, &head); err != nil {
		return summary{}, false, []error{fmt.Errorf("not a Kubernetes object: %w", err)}
	}
	if head.APIVersion != resourcev1.SchemeGroupVersion.String() || head.Kind != "ResourceSlice" {
		return summary{}, false, []error{fmt.Errorf("want apiVersion %s kind ResourceSlice, got %q %q",
			resourcev1.SchemeGroupVersion, head.APIVersion, head.Kind)}
	}
	external := &resourcev1.ResourceSlice{}
	strictErrs, err := kjson.UnmarshalStrict(js, external)
	sum := summary{Name: external.Name, Driver: external.Spec.Driver, Pool: external.Spec.Pool.Name}
	if err != nil {
		return sum, false, []error{err}
	}
	if len(strictErrs) > 0 {
		return sum, false, strictErrs
	}

	legacyscheme.Scheme.Default(external)
	internal := &resource.ResourceSlice{}
	if err := legacyscheme.Scheme.Convert(external, internal, nil); err != nil {
		return sum, false, []error{fmt.Errorf("conversion to the internal type: %w", err)}
	}
	// What the API server's create handler does before the strategy runs.
	rest.FillObjectMetaSystemFields(internal)
	ctx := genericapirequest.WithNamespace(context.Background(), metav1.NamespaceNone)
	ctx = genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "create", APIGroup: resourcev1.GroupName,
		APIVersion: resourcev1.SchemeGroupVersion.Version, Resource: "resourceslices", Name: internal.Name,
	})
	if err := rest.BeforeCreate(resourceslice.Strategy, ctx, internal); err != nil {
		return sum, false, []error{err}
	}
	sum.Devices = len(internal.Spec.Devices)
	for _, d := range internal.Spec.Devices {
		sum.Taints += len(d.Taints)
	}
	return sum, false, nil
}
