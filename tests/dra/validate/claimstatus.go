package main

import (
	"context"
	"encoding/json"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/resource"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
	kjson "sigs.k8s.io/json"
)

// The identity the driver's writes are checked as: the DaemonSet's service account, its token bound to
// a pod on the claim's node (what the kubelet's projected tokens carry).
const (
	driverServiceAccount = "system:serviceaccount:kube-system:topo-device-plugin"
	driverNode           = "node-a"
)

type claimSummary struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Devices int    `json:"devices"`
	// Authorization checks the status strategy asked for, "VERB RESOURCE/SUBRESOURCE NAME" (all allowed here:
	// the caller compares them with the RBAC it grants).
	Authorized []string `json:"authorized"`
}

// recordingAuthorizer allows everything and remembers what it was asked.
type recordingAuthorizer struct{ asked []string }

func (r *recordingAuthorizer) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	r.asked = append(r.asked, fmt.Sprintf("%s %s/%s %s", a.GetVerb(), a.GetResource(), a.GetSubresource(), a.GetName()))
	return authorizer.DecisionAllow, "", nil
}

// checkClaimStatus runs a status update of the claim in `js` from the same claim without status.devices:
// decoding, defaulting, conversion, then rest.BeforeUpdate with the registry's status strategy (field
// dropping, hand-written and declarative validation, the per-driver authorization of status.devices).
func checkClaimStatus(js []byte) ([]byte, string, bool, []error) {
	external := &resourcev1.ResourceClaim{}
	strictErrs, err := kjson.UnmarshalStrict(js, external)
	name := fmt.Sprintf("ResourceClaim %q", external.Name)
	if err != nil {
		return nil, name, false, []error{err}
	}
	if len(strictErrs) > 0 {
		return nil, name, false, strictErrs
	}
	legacyscheme.Scheme.Default(external)
	newClaim := &resource.ResourceClaim{}
	if err := legacyscheme.Scheme.Convert(external, newClaim, nil); err != nil {
		return nil, name, false, []error{fmt.Errorf("conversion to the internal type: %w", err)}
	}
	if newClaim.UID == "" {
		newClaim.UID = "0b4c1d1e-0000-4000-8000-000000000001"
	}
	if newClaim.ResourceVersion == "" {
		newClaim.ResourceVersion = "1"
	}
	newClaim.CreationTimestamp = metav1.Now()
	old := newClaim.DeepCopy()
	old.Status.Devices = nil

	auth := &recordingAuthorizer{}
	strategy := resourceclaim.NewStatusStrategy(resourceclaim.NewStrategy(nil, auth))
	ctx := genericapirequest.WithNamespace(context.Background(), newClaim.Namespace)
	ctx = genericapirequest.WithUser(ctx, &user.DefaultInfo{Name: driverServiceAccount,
		Extra: map[string][]string{serviceaccount.NodeNameKey: {driverNode}}})
	ctx = genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "patch", APIGroup: resourcev1.GroupName,
		APIVersion: resourcev1.SchemeGroupVersion.Version, Resource: "resourceclaims", Subresource: "status",
		Namespace: newClaim.Namespace, Name: newClaim.Name,
	})
	if err := rest.BeforeUpdate(strategy, ctx, newClaim, old); err != nil {
		return nil, name, false, []error{err}
	}
	line, _ := json.Marshal(claimSummary{Name: newClaim.Name, Kind: "ResourceClaim", Devices: len(newClaim.Status.Devices),
		Authorized: auth.asked})
	return line, name, false, nil
}
