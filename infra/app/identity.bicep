// The user-assigned identity every client of the app signs in with: the
// Functions host's storage, the handler's SQL, Redis, Blob and Queue
// clients, Application Insights, and Event Grid's dead-lettering.
param name string
param location string
param tags object

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output name string = identity.name
output clientId string = identity.properties.clientId
output principalId string = identity.properties.principalId
