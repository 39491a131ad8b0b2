/** Request content types of the Kubernetes API (--kube-api-content-type); free of the client library so flag parsing does not load it. */
export const PROTOBUF_CONTENT_TYPE = 'application/vnd.kubernetes.protobuf';
export const JSON_CONTENT_TYPE = 'application/json';
