// order-guard on Azure Functions, as `azd up` provisions it: one resource
// group holding the app (Flex Consumption by default, Premium as a
// parameter), its data (Azure SQL, Azure Managed Redis), its messaging
// (the dead-letter container, the announcements queue, the Event Grid topic
// and subscription) and its monitoring (Application Insights). One
// user-assigned identity is every client's: no key or password anywhere.
//
// What a template cannot do (migrate as the admin, the app's database
// user, the package, the smoke test) the hooks in infra/hooks do.
targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('The azd environment name: the resource group is rg-<name>, every other name derives from it.')
param environmentName string

@minLength(1)
@description('Region of every resource (one where Flex Consumption runs, for the default plan).')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('The deploying user\'s object id (azd sets it): the Azure SQL Entra admin, and the operator\'s roles (Redis, the container, the queue, the topic).')
param principalId string

@description('The deploying user\'s sign-in name (the preprovision hook sets it): the Entra admin\'s login on Azure SQL.')
param principalName string

@description('FC1: Flex Consumption (Linux). EP1: Premium (Elastic Premium, Linux).')
@allowed([
  'FC1'
  'EP1'
])
param planSku string = 'FC1'

@description('Event types that carry orders (ORDER_EVENT_TYPES): the subscription\'s filter and the handler\'s.')
param orderEventTypes array = [
  'Trading.Order.Placed'
]

@description('Whether to make the Event Grid subscription to OrderTrigger. Event Grid checks the function exists, so the postdeploy hook sets it once the package is deployed and provisions again.')
param orderSubscription bool = false

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
    functionAppId: app.outputs.id
    orderEventTypes: orderEventTypes
    orderSubscription: orderSubscription
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
    planSku: planSku
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    identityPrincipalId: identity.outputs.principalId
    appInsightsConnectionString: monitoring.outputs.connectionString
    redisHostName: data.outputs.redisHostName
    sqlServerFqdn: data.outputs.sqlServerFqdn
    sqlDatabaseName: data.outputs.sqlDatabaseName
    deadLetterStorage: deadLetterStorage
    outboxStorage: outboxStorage
    orderEventTypes: orderEventTypes
  }
}

// What azd keeps in its environment: the hooks read these, and an operator
// exports the settings ones (`azd env get-values`) to run `status`,
// `prune-guard`, `dead-letters` and `outbox` as themselves (the SQL
// connection signs in as them: Active Directory Default).
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = app.outputs.name
output AZURE_IDENTITY_NAME string = identity.outputs.name
output AZURE_IDENTITY_CLIENT_ID string = identity.outputs.clientId
output SQL_SERVER_NAME string = data.outputs.sqlServerName
output SQL_SERVER_FQDN string = data.outputs.sqlServerFqdn
output SQL_DATABASE_NAME string = data.outputs.sqlDatabaseName
output EVENT_GRID_TOPIC_ENDPOINT string = messaging.outputs.topicEndpoint
output REDIS_URL string = '${data.outputs.redisHostName}:10000,ssl=True'
output REDIS_AUTH string = 'entra-id'
output REDIS_CLUSTER string = 'false'
output SQL_CONNECTION_STRING string = 'Server=tcp:${data.outputs.sqlServerFqdn},1433;Initial Catalog=${data.outputs.sqlDatabaseName};Authentication=Active Directory Default;Encrypt=True'
output DEAD_LETTER_STORAGE string = deadLetterStorage
output OUTBOX_STORAGE string = outboxStorage
output ORDER_EVENT_TYPES string = join(orderEventTypes, ',')
