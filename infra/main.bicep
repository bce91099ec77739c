// order-guard on Azure Functions, as `azd up` provisions it: one resource
// group holding the app (Flex Consumption), its data (Azure SQL, Azure
// Managed Redis), its messaging (the dead-letter container, the
// announcements queue, the Event Grid topic), its monitoring (Application
// Insights) and what tells an operator they are needed (alert rules, an
// action group, a workbook of the outcomes). One user-assigned identity is
// every client's: no key or password anywhere.
//
// What a template cannot do (migrate as the admin, the app's database
// user, the package, the Event Grid subscription once OrderTrigger exists,
// the smoke test) the hooks in infra/hooks do.
targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('The azd environment name: the resource group is rg-<name>, every other name derives from it.')
param environmentName string

// Every resource goes to this one region, so it must offer Flex
// Consumption, Azure Managed Redis (Microsoft.Cache/redisEnterprise) and
// Azure SQL together. The list of such regions changes as Azure adds them
// and is not restricted here (a stale @allowed list refuses a region that
// works, or admits one that does not): `az functionapp
// list-flexconsumption-locations` and `az provider show --namespace
// Microsoft.Cache --query "resourceTypes[?resourceType=='redisEnterprise'].locations"`
// say which regions offer the first two; Azure SQL is in every public
// region. Microsoft's Flex samples (Azure-Samples/
// azure-functions-flex-consumption-samples, IaC/bicep/README.md,
// "Supported Regions") send their users to the same command rather than
// list regions. README, "Deploy to Azure", says the same to the user.
@minLength(1)
@description('Region of every resource: one that offers Flex Consumption, Azure Managed Redis and Azure SQL.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('The deployer\'s object id (azd sets it): the Azure SQL Entra admin, and the operator\'s roles (Redis, the container, the queue, the topic).')
param principalId string

@description('What the deployer is: a user (azd up from a workstation) or a service principal (a pipeline). Every operator role assignment and the SQL Entra admin take it.')
@allowed([
  'User'
  'ServicePrincipal'
])
param principalType string = 'User'

@description('The deployer\'s sign-in name (the preprovision hook sets it): a user\'s UPN, or a service principal\'s application (client) id. The Entra admin\'s login on Azure SQL.')
param principalName string

@description('Event types that carry orders (ORDER_EVENT_TYPES): the subscription\'s filter (made by the postdeploy hook) and the handler\'s.')
param orderEventTypes array = [
  'Trading.Order.Placed'
]

@description('The database\'s service objective (DTU model, Standard tier). With maximumInstanceCount it sets each instance\'s SQL_POOL_SIZE (app.bicep).')
@allowed([
  'S0'
  'S1'
  'S2'
  'S3'
])
param sqlServiceObjective string = 'S0'

@description('The most instances Flex Consumption runs for a function. 40 is the lowest Flex accepts in most regions; SQL_POOL_SIZE is sized from it and the database (app.bicep).')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Where the alerts are e-mailed (an address, or empty: the alerts still fire, in the portal\'s Alerts view).')
param alertEmail string = ''

@description('Events answered `retry` in 15 minutes above which an operator is alerted.')
@minValue(1)
param retryAlertThreshold int = 20

var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var functionAppName = 'func-orderguard-${resourceToken}'
// The account of the app's own data (dead letters, announcements), apart
// from the Functions host's: each role on it can then be narrow.
var dataStorageName = 'stdata${resourceToken}'
var deadLetterStorage = 'https://${dataStorageName}.blob.${environment().suffixes.storage}/deadletters'
var outboxStorage = 'https://${dataStorageName}.queue.${environment().suffixes.storage}/order-executed'

// Max concurrent workers (requests) of each Standard service objective:
// Azure SQL's "Resource limits for single databases using the DTU
// purchasing model". A pooled connection running a statement takes one;
// the sessions (600 on S0 and up) are not the limit.
var sqlMaxWorkers = {
  S0: 60
  S1: 90
  S2: 120
  S3: 200
}

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: 'rg-${environmentName}'
  location: location
  tags: tags
}

module identity 'app/identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    name: 'id-orderguard-${resourceToken}'
    location: location
    tags: tags
  }
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    resourceToken: resourceToken
    location: location
    tags: tags
    identityPrincipalId: identity.outputs.principalId
  }
}

module data 'app/data.bicep' = {
  name: 'data'
  scope: rg
  params: {
    resourceToken: resourceToken
    location: location
    tags: tags
    identityPrincipalId: identity.outputs.principalId
    adminObjectId: principalId
    adminLogin: principalName
    adminPrincipalType: principalType
    sqlServiceObjective: sqlServiceObjective
    workspaceId: monitoring.outputs.workspaceId
  }
}

module messaging 'app/messaging.bicep' = {
  name: 'messaging'
  scope: rg
  params: {
    resourceToken: resourceToken
    location: location
    tags: tags
    storageName: dataStorageName
    identityId: identity.outputs.id
    identityPrincipalId: identity.outputs.principalId
    operatorPrincipalId: principalId
    operatorPrincipalType: principalType
  }
}

module app 'app/app.bicep' = {
  name: 'app'
  scope: rg
  params: {
    name: functionAppName
    resourceToken: resourceToken
    location: location
    tags: tags
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    identityPrincipalId: identity.outputs.principalId
    appInsightsConnectionString: monitoring.outputs.connectionString
    redisHostName: data.outputs.redisHostName
    sqlServerFqdn: data.outputs.sqlServerFqdn
    sqlDatabaseName: data.outputs.sqlDatabaseName
    sqlMaxWorkers: sqlMaxWorkers[sqlServiceObjective]
    maximumInstanceCount: maximumInstanceCount
    deadLetterStorage: deadLetterStorage
    outboxStorage: outboxStorage
    orderEventTypes: orderEventTypes
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  params: {
    resourceToken: resourceToken
    location: location
    tags: tags
    appInsightsId: monitoring.outputs.appInsightsId
    topicId: messaging.outputs.topicId
    alertEmail: alertEmail
    retryAlertThreshold: retryAlertThreshold
  }
}

// What azd keeps in its environment: the hooks read these, and an operator
// exports the settings ones (`azd env get-values`) to run `status`,
// `prune-guard`, `dead-letters` and `outbox` as themselves (the SQL
// connection signs in as them: Active Directory Default).
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_SUBSCRIPTION_ID string = subscription().subscriptionId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = app.outputs.name
output AZURE_FUNCTION_APP_ID string = app.outputs.id
output AZURE_FUNCTION_MAX_INSTANCES int = app.outputs.maximumInstanceCount
output AZURE_FUNCTION_SQL_POOL_SIZE int = app.outputs.sqlPoolSize
output AZURE_IDENTITY_NAME string = identity.outputs.name
output AZURE_IDENTITY_ID string = identity.outputs.id
output AZURE_IDENTITY_CLIENT_ID string = identity.outputs.clientId
output SQL_SERVER_NAME string = data.outputs.sqlServerName
output SQL_SERVER_FQDN string = data.outputs.sqlServerFqdn
output SQL_DATABASE_NAME string = data.outputs.sqlDatabaseName
output EVENT_GRID_TOPIC_NAME string = messaging.outputs.topicName
output EVENT_GRID_TOPIC_ID string = messaging.outputs.topicId
output EVENT_GRID_TOPIC_ENDPOINT string = messaging.outputs.topicEndpoint
output DEAD_LETTER_CONTAINER_ID string = messaging.outputs.deadLetterContainerId
output DEAD_LETTER_STORAGE_ACCOUNT_ID string = messaging.outputs.storageId
output APPLICATIONINSIGHTS_NAME string = monitoring.outputs.appInsightsName
output ORDER_GUARD_WORKBOOK_ID string = alerts.outputs.workbookId
output REDIS_URL string = '${data.outputs.redisHostName}:10000,ssl=True'
output REDIS_AUTH string = 'entra-id'
output REDIS_CLUSTER string = 'false'
output SQL_CONNECTION_STRING string = 'Server=tcp:${data.outputs.sqlServerFqdn},1433;Initial Catalog=${data.outputs.sqlDatabaseName};Authentication=Active Directory Default;Encrypt=True'
output DEAD_LETTER_STORAGE string = deadLetterStorage
output OUTBOX_STORAGE string = outboxStorage
output ORDER_EVENT_TYPES string = join(orderEventTypes, ',')
