// What tells an operator they are needed, and one view of the outcomes.
//
// - An action group: e-mail to alertEmail when one is given; without one the
//   rules still exist and fire, listed in the portal (Monitor → Alerts).
// - Alert rules, each for a state that needs a person (docs/telemetry.md,
//   "Alerts and what to run", names the command that looks into each):
//     dead-lettered    Event Grid gave up on an order (topic metric)
//     dropped          Event Grid dropped an order: not delivered, and
//                      its dead-letter write failed (topic metric)
//     operator-needed  a store failure no retry fixes: a right or the schema
//                      missing (`order_guard.store.errors`, error.type
//                      misconfigured or unmigrated)
//     parked           an announcement the outbox stopped trying (the
//                      handler's Error line)
//     outbox-behind    the outbox failing to send for 10 minutes, so its
//                      oldest due announcement is that old (the handler's
//                      dispatch failure lines)
//     retries          more events answered `retry` than retryAlertThreshold
//                      in 15 minutes (`order_guard.events`)
//   The topic's two are Azure Monitor metric alerts and need nothing of the
//   handler. The others query Application Insights: the handler's metrics
//   (customMetrics, attributes in customDimensions) and its console lines,
//   which the Functions host sends as `traces` (category
//   Host.Function.Console).
// - A workbook, "order-guard outcomes", on Application Insights.
param resourceToken string
param location string
param tags object
param appInsightsId string
param topicId string
@description('Where the alerts are e-mailed; empty: none (the alerts still fire, in the portal).')
param alertEmail string
@description('Events answered `retry` in 15 minutes above which the retries alert fires.')
param retryAlertThreshold int

var operatorEmail = {
  name: 'operator'
  emailAddress: alertEmail
  useCommonAlertSchema: true
}

resource operators 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'ag-orderguard-${resourceToken}'
  location: 'Global'
  tags: tags
  properties: {
    groupShortName: 'orderguard'
    enabled: true
    emailReceivers: empty(alertEmail) ? [] : [
      operatorEmail
    ]
  }
}

// Event Grid's own counts on the topic (Microsoft.EventGrid/topics
// metrics), summed over 15 minutes, looked at every 5.
var topicAlerts = [
  {
    name: 'dead-lettered'
    metric: 'DeadLetteredCount'
    severity: 1
    description: 'Event Grid dead-lettered an order after its retries (30 attempts in 24 h) or on a 400/403/413 answer. DeadLetterSweep replays it within 5 minutes; if it stays, run `order-guard dead-letters list`, then `order-guard status ORDER_ID` (docs/dead-letters.md).'
  }
  {
    name: 'dropped'
    metric: 'DroppedEventCount'
    severity: 0
    description: 'Event Grid dropped an order: neither delivered nor dead-lettered (its retries ran out and the dead-letter write failed). Check the subscription (`az eventgrid event-subscription show`), the identity\'s role on the container, and have the publisher send the order again.'
  }
]

resource topicRules 'Microsoft.Insights/metricAlerts@2018-03-01' = [
  for rule in topicAlerts: {
    name: 'orderguard-${rule.name}-${resourceToken}'
    location: 'global'
    tags: tags
    properties: {
      description: rule.description
      severity: rule.severity
      enabled: true
      scopes: [
        topicId
      ]
      evaluationFrequency: 'PT5M'
      windowSize: 'PT15M'
      autoMitigate: true
      criteria: {
        'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
        allOf: [
          {
            criterionType: 'StaticThresholdCriterion'
            name: rule.metric
            metricNamespace: 'Microsoft.EventGrid/topics'
            metricName: rule.metric
            operator: 'GreaterThan'
            threshold: 0
            timeAggregation: 'Total'
          }
        ]
      }
      actions: [
        {
          actionGroupId: operators.id
        }
      ]
    }
  }
]

// Queries over Application Insights (its classic tables: customMetrics,
// traces). Each returns a row per occurrence (a rule fires when their
// count in its window is above its threshold), or a measure column whose
// total is compared instead (retries).
var logAlerts = [
  {
    name: 'operator-needed'
    severity: 1
    window: 'PT5M'
    periods: 1
    threshold: 0
    query: '''customMetrics
| where name == "order_guard.store.errors"
| where tostring(customDimensions["error.type"]) in ("misconfigured", "unmigrated")
| where value > 0'''
    measure: ''
    description: 'A store failure no retry fixes (a right or the schema missing): every event is answered `retry` until it is fixed. The log line says which right; run `order-guard migrate` as the admin, or add the app\'s user to order_guard_app (docs/sqlserver.md).'
  }
  {
    name: 'parked'
    severity: 2
    window: 'PT5M'
    periods: 1
    threshold: 0
    query: '''traces
| where message contains " parked: " and message contains "outbox retry"'''
    measure: ''
    description: 'An announcement was parked: its destination refused it twice for its content. Run `order-guard outbox list` (parked ones marked, with LastError), fix the cause, then `order-guard outbox retry MESSAGE_ID` (docs/outbox.md).'
  }
  {
    name: 'outbox-behind'
    severity: 2
    window: 'PT5M'
    periods: 2
    threshold: 0
    query: '''traces
| where message contains "announcements not sent in this dispatch round"
    or message contains "outbox: not drained"
    or message contains "outbox: still sending after"'''
    measure: ''
    description: 'The outbox has failed to send for 10 minutes: its oldest due announcement is at least that old. Run `order-guard outbox list` (the counts, and each waiting row\'s attempts and last error); check the queue exists and the identity\'s role on it (docs/outbox.md).'
  }
  {
    name: 'retries'
    severity: 2
    window: 'PT15M'
    periods: 1
    threshold: retryAlertThreshold
    query: '''customMetrics
| where name == "order_guard.events"
| where tostring(customDimensions["order_guard.outcome"]) == "retry"
| summarize retries = sum(value) by bin(timestamp, 1m)'''
    measure: 'retries'
    description: 'More events than the threshold were answered `retry` in 15 minutes: a dependency (SQL, Redis) is failing or slow. Read the retry lines\' reason (docs/telemetry.md, Reading the handler\'s logs), then `order-guard status ORDER_ID` for one of them.'
  }
]

resource logRules 'Microsoft.Insights/scheduledQueryRules@2022-06-15' = [
  for rule in logAlerts: {
    name: 'orderguard-${rule.name}-${resourceToken}'
    location: location
    tags: tags
    kind: 'LogAlert'
    properties: {
      displayName: 'order-guard: ${rule.name}'
      description: rule.description
      severity: rule.severity
      enabled: true
      scopes: [
        appInsightsId
      ]
      evaluationFrequency: 'PT5M'
      windowSize: rule.window
      autoMitigate: true
      criteria: {
        allOf: [
          {
            query: rule.query
            // A count of the rows, or the total of the measure column.
            timeAggregation: empty(rule.measure) ? 'Count' : 'Total'
            metricMeasureColumn: empty(rule.measure) ? null : rule.measure
            operator: 'GreaterThan'
            threshold: rule.threshold
            failingPeriods: {
              numberOfEvaluationPeriods: rule.periods
              minFailingPeriodsToAlert: rule.periods
            }
          }
        ]
      }
      actions: {
        actionGroups: [
          operators.id
        ]
      }
    }
  }
]

// One view of the outcomes over a chosen time range: executed, duplicates,
// retries and the rest (the handler's metric), what Event Grid
// dead-lettered or dropped (the topic's metrics) and what the sweep
// replayed, and the outbox (announcements sent by the timer, dispatch
// failures, parked ones).
var timeRange = {
  type: 9
  name: 'parameters'
  content: {
    version: 'KqlParameterItem/1.0'
    parameters: [
      {
        id: '4c1f0b52-7a0e-4a8f-9d55-0d6a1c8f2b01'
        version: 'KqlParameterItem/1.0'
        name: 'TimeRange'
        label: 'Time range'
        type: 4
        isRequired: true
        value: {
          durationMs: 86400000
        }
        typeSettings: {
          selectableValues: [
            {
              durationMs: 3600000
            }
            {
              durationMs: 14400000
            }
            {
              durationMs: 86400000
            }
            {
              durationMs: 604800000
            }
          ]
        }
      }
    ]
    style: 'pills'
    queryType: 0
    resourceType: 'microsoft.insights/components'
  }
}

var workbook = {
  version: 'Notebook/1.0'
  items: [
    {
      type: 1
      name: 'title'
      content: {
        json: '# order-guard outcomes\n\nEvery event ends in one outcome (README, Outcomes). Counts come from the handler\'s metric `order_guard.events`; Event Grid\'s dead-lettered and dropped counts from the topic. The alert rules of this deployment and the command that looks into each: docs/telemetry.md, "Alerts and what to run". The outbox\'s oldest due announcement is not exported as a metric: `order-guard outbox list` shows it.'
      }
    }
    timeRange
    {
      type: 3
      name: 'outcomes'
      content: {
        version: 'KqlItem/1.0'
        title: 'Outcomes per 5 minutes (executed, duplicate, conflict, rejected, in_progress, retry)'
        query: '''customMetrics
| where timestamp {TimeRange}
| where name == "order_guard.events"
| summarize events = sum(value) by bin(timestamp, 5m), outcome = tostring(customDimensions["order_guard.outcome"])
| render timechart'''
        size: 0
        timeContextFromParameter: 'TimeRange'
        queryType: 0
        resourceType: 'microsoft.insights/components'
        visualization: 'timechart'
      }
    }
    {
      type: 3
      name: 'retries'
      content: {
        version: 'KqlItem/1.0'
        title: 'Retries and in-progress answers per minute (Event Grid delivers these again)'
        query: '''customMetrics
| where timestamp {TimeRange}
| where name == "order_guard.events"
| extend outcome = tostring(customDimensions["order_guard.outcome"])
| where outcome in ("retry", "in_progress")
| summarize events = sum(value) by bin(timestamp, 1m), outcome
| render timechart'''
        size: 0
        timeContextFromParameter: 'TimeRange'
        queryType: 0
        resourceType: 'microsoft.insights/components'
        visualization: 'timechart'
      }
    }
    {
      type: 10
      name: 'dead-letters'
      content: {
        chartId: 'order-guard-dead-letters'
        version: 'MetricsItem/2.0'
        title: 'Dead-lettered and dropped by Event Grid (topic)'
        size: 0
        chartType: 2
        resourceType: 'microsoft.eventgrid/topics'
        metricScope: 0
        resourceIds: [
          topicId
        ]
        timeContextFromParameter: 'TimeRange'
        timeContext: {
          durationMs: 86400000
        }
        metrics: [
          {
            namespace: 'microsoft.eventgrid/topics'
            metric: 'microsoft.eventgrid/topics--DeadLetteredCount'
            aggregation: 1
          }
          {
            namespace: 'microsoft.eventgrid/topics'
            metric: 'microsoft.eventgrid/topics--DroppedEventCount'
            aggregation: 1
          }
        ]
      }
    }
    {
      type: 3
      name: 'sweeps'
      content: {
        version: 'KqlItem/1.0'
        title: 'Dead-lettered events the sweep replayed, and those it left'
        query: '''traces
| where timestamp {TimeRange}
| where message contains "DeadLetterSweep: blobs="
| parse message with * "events=" events:long " " * "unresolved=" unresolved:long " " *
| summarize replayed = sum(events), left = sum(unresolved) by bin(timestamp, 5m)
| render timechart'''
        size: 0
        timeContextFromParameter: 'TimeRange'
        queryType: 0
        resourceType: 'microsoft.insights/components'
        visualization: 'timechart'
      }
    }
    {
      type: 3
      name: 'outbox'
      content: {
        version: 'KqlItem/1.0'
        title: 'Outbox: announcements the timer sent, dispatch failures, parked'
        query: '''traces
| where timestamp {TimeRange}
| where message contains "outbox:" or message contains " parked: "
| extend kind = case(
    message contains " parked: ", "parked",
    message contains "announcements not sent in this dispatch round" or message contains "not drained" or message contains "still sending after", "dispatch failed",
    message contains "announcements sent", "sent by the timer",
    "")
| where kind != ""
| parse message with * "outbox: " sent:long " announcements sent" *
| summarize lines = count(), sent = sum(sent) by bin(timestamp, 5m), kind
| extend value = iff(kind == "sent by the timer", sent, lines)
| project timestamp, kind, value
| render timechart'''
        size: 0
        timeContextFromParameter: 'TimeRange'
        queryType: 0
        resourceType: 'microsoft.insights/components'
        visualization: 'timechart'
      }
    }
  ]
  fallbackResourceIds: [
    appInsightsId
  ]
}

resource outcomes 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, 'order-guard-outcomes', resourceToken)
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'order-guard outcomes'
    category: 'workbook'
    sourceId: appInsightsId
    version: 'Notebook/1.0'
    serializedData: string(workbook)
  }
}

output actionGroupId string = operators.id
output workbookId string = outcomes.id
