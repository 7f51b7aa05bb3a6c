{{- define "gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: svc-gateway
{{- end -}}

{{/* Selector labels of one component: gateway, operator, redis, postgres, migrate. */}}
{{- define "gateway.selector" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "gateway.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gateway.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
{{- toYaml . }}
{{- else -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{- define "gateway.containerSecurityContext" -}}
{{- with .Values.containerSecurityContext }}
{{- toYaml . }}
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end }}
{{- end -}}

{{- define "gateway.storesSecret" -}}
{{- printf "%s-stores" (include "gateway.fullname" .) -}}
{{- end -}}

{{/* Whether the chart writes a store's URL into its own Secret: an in-cluster store, or a URL
given in values; otherwise the URL is in an existing Secret. */}}
{{- define "gateway.redisOwned" -}}
{{- if or .Values.redis.inCluster.enabled .Values.redis.url -}}true{{- end -}}
{{- end -}}

{{- define "gateway.postgresOwned" -}}
{{- if or .Values.postgres.inCluster.enabled .Values.postgres.url -}}true{{- end -}}
{{- end -}}

{{- define "gateway.redisSecretRef" -}}
{{- if include "gateway.redisOwned" . -}}
name: {{ include "gateway.storesSecret" . }}
key: redis-url
{{- else -}}
name: {{ required "redis: set existingSecret, url or inCluster.enabled" .Values.redis.existingSecret }}
key: {{ .Values.redis.existingSecretKey }}
{{- end -}}
{{- end -}}

{{- define "gateway.postgresSecretRef" -}}
{{- if include "gateway.postgresOwned" . -}}
name: {{ include "gateway.storesSecret" . }}
key: database-url
{{- else -}}
name: {{ .Values.postgres.existingSecret }}
key: {{ .Values.postgres.existingSecretKey }}
{{- end -}}
{{- end -}}

{{/* Postgres is optional until the ledger needs it: on when any source is given. */}}
{{- define "gateway.hasPostgres" -}}
{{- if or (include "gateway.postgresOwned" .) .Values.postgres.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "gateway.adminTokenSecret" -}}
{{- default (printf "%s-admin" (include "gateway.fullname" .)) .Values.gateway.adminTokenSecret -}}
{{- end -}}

{{- define "gateway.responsesSecret" -}}
{{- default (printf "%s-responses" (include "gateway.fullname" .)) .Values.gateway.responsesSecret -}}
{{- end -}}

{{- define "gateway.databaseEnv" -}}
{{- if include "gateway.hasPostgres" . }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- include "gateway.postgresSecretRef" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The stores' URLs, as every gateway container gets them: the database through its pooler
when there is one (migrations keep the direct URL: PgBouncer's transaction pooling cannot run
them). */}}
{{- define "gateway.storeEnv" -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- include "gateway.redisSecretRef" . | nindent 6 }}
{{- if and .Values.postgres.poolerSecret (include "gateway.hasPostgres" .) }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.postgres.poolerSecret }}
      key: {{ .Values.postgres.poolerSecretKey }}
- name: GATEWAY_DATABASE_POOLER
  value: transaction
{{- else }}
{{- include "gateway.databaseEnv" . }}
{{- end }}
{{- end -}}

{{- define "gateway.migrateContainer" -}}
name: migrate
image: {{ include "gateway.image" (dict "image" .Values.gateway.image "root" .) }}
imagePullPolicy: {{ .Values.gateway.image.pullPolicy }}
args: ["migrate"]
env:
  {{- include "gateway.databaseEnv" . | indent 2 }}
securityContext:
  {{- include "gateway.containerSecurityContext" . | nindent 2 }}
resources:
  {{- toYaml .Values.gateway.resources | nindent 2 }}
{{- end -}}

{{/* Whether the operator owns the gateway Deployment's replicas. Then the chart leaves
spec.replicas out, so `helm upgrade` never resets what the scaler (or `kubectl scale`) set:
Helm's three-way merge only patches fields the chart renders. */}}
{{- define "gateway.operatorScales" -}}
{{- if and .Values.operator.enabled .Values.operator.scaleGateway -}}true{{- end -}}
{{- end -}}

{{/* Names of the operator's Secret and Lease: derived from the release unless set, so two
releases in one namespace do not share them. */}}
{{/* The Secrets the operator reads, as a YAML list: the config Secret, then operator.secrets. */}}
{{- define "gateway.operatorSecrets" -}}
{{- toYaml (uniq (prepend .Values.operator.secrets (include "gateway.configSecret" .))) -}}
{{- end -}}

{{- define "gateway.configSecret" -}}
{{- default (printf "%s-config" (include "gateway.fullname" .)) .Values.operator.configSecret -}}
{{- end -}}

{{- define "gateway.lease" -}}
{{- default (printf "%s-operator" (include "gateway.fullname" .)) .Values.operator.lease -}}
{{- end -}}
